"""Reading recorded console sessions through the API, under RBAC, never through the files.

`GET …/namespaces/NS/machines/NAME/recordings` answers a `RecordingList`
(each file's name, size, start and title); `GET …/recordings/FILE` answers
the asciicast file itself (`application/x-asciicast`). Both are authorized
as `get machines/recordings` on that machine, as kube-apiserver authorized
them before proxying; a machine's recordings stay readable after the machine
is gone. Only names a recording can have are opened (`recordings.FILE_NAME`).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from aiohttp import web

from subres.kube.status import StatusError
from subres.protocol import asciicast
from subres.server.state import State
from subres.serving.units import rfc3339
from subres.sessions.recordings import FILE_NAME

__all__ = ["listing", "one"]

CONTENT_TYPE = "application/x-asciicast"
HEADER_BYTES = 4096


async def listing(state: State, request: web.Request) -> web.Response:
    """The recordings of one machine, newest first."""
    folder = _folder(state, request)
    items = await asyncio.to_thread(_items, folder) if folder is not None else []
    body = {
        "kind": "RecordingList",
        "apiVersion": f"{state.config.group}/{state.config.version}",
        "metadata": {},
        "items": items,
    }
    return web.Response(
        body=json.dumps(body, separators=(",", ":")).encode(), content_type="application/json"
    )


async def one(state: State, request: web.Request) -> web.StreamResponse:
    """One recording file."""
    folder = _folder(state, request)
    name = request.match_info["file"]
    path = folder / name if folder is not None and FILE_NAME.match(name) else None
    if path is None or not await asyncio.to_thread(path.is_file):
        raise StatusError(404, f'recording "{name}" not found')
    return web.FileResponse(
        path,
        headers={
            "Content-Type": CONTENT_TYPE,
            "Content-Disposition": f'inline; filename="{name}"',
            "Cache-Control": "no-store",
        },
    )


def _folder(state: State, request: web.Request) -> Path | None:
    parent = state.config.parent(request.match_info["resource"])
    if parent is None or "console" not in parent.subresources:
        raise StatusError(404, f"the server could not find the requested resource {request.path}")
    root = state.recordings.directory
    if root is None:
        return None
    namespace, name = request.match_info["namespace"], request.match_info["name"]
    if any(part in ("", ".", "..") or "/" in part for part in (namespace, name)):
        raise StatusError(400, f"{namespace}/{name} is not an object name")
    return root / namespace / name


def _items(folder: Path) -> list[dict[str, Any]]:
    items = []
    for path in folder.glob("*.cast") if folder.is_dir() else []:
        if not FILE_NAME.match(path.name):
            continue
        try:
            info = path.stat()
            with path.open("rb") as file:
                first = file.readline(HEADER_BYTES)
            header, _ = asciicast.read([first])
        except (OSError, asciicast.RecordingError):
            continue
        items.append(
            {
                "name": path.name,
                "size": info.st_size,
                "started": rfc3339(header.timestamp),
                "modified": rfc3339(info.st_mtime),
                "title": header.title,
            }
        )
    items.sort(key=lambda item: str(item["name"]), reverse=True)
    return items
