"""Reading recorded sessions through the API, under RBAC, never through the files.

`GET …/namespaces/NS/machines/NAME/recordings` answers a `RecordingList`
(each file's name, subresource, size, start and title), console and display
recordings together; `GET …/recordings/FILE` answers the file itself
(`application/x-asciicast`, or `application/vnd.subres.display-recording`
for `protocol.displayrec`). Both are authorized
as `get machines/recordings` on that machine, as kube-apiserver authorized
them before proxying; a machine's recordings stay readable after the machine
is gone. Only names a recording can have are opened (`recordings.FILE_NAME`).

Each replica writes the recordings of the consoles it owns; a listing asks
every replica (`fanout`) and merges by name, and a file this replica does not
have is fetched from the one that has it, so any replica serves any
recording whether the directory is shared or each replica has its own.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from aiohttp import web

from subres.kube.status import StatusError
from subres.protocol import asciicast, displayrec
from subres.server import fanout
from subres.server.state import State
from subres.serving.units import rfc3339
from subres.sessions.recordings import FILE_NAME

__all__ = ["DISPLAY_TYPE", "listing", "local_listing", "local_one", "one"]

DISPLAY_TYPE = "application/vnd.subres.display-recording"

CONTENT_TYPES = {".cast": "application/x-asciicast", ".display": DISPLAY_TYPE}
SUBRESOURCES = {".cast": "console", ".display": "vnc"}
HEADER_BYTES = 4096


MAX_LISTING = 16 << 20
"""The largest recordings listing read from another replica."""
MAX_FILE = 1 << 30
"""The largest recording read from another replica."""


async def listing(state: State, request: web.Request) -> web.Response:
    """The recordings of one machine on every replica, newest first."""
    items = await _local_items(state, request)
    answers = await fanout.ask_others(state, _peer_path(request), limit=MAX_LISTING)
    failed = [*answers.failed, *answers.status]
    for member, body in answers.ok.items():
        try:
            items += [i for i in json.loads(body)["items"] if isinstance(i, dict)]
        except (ValueError, KeyError, TypeError):
            failed.append(member)
    # A shared directory (ReadWriteMany) shows every file on every replica: once each.
    unique = {str(i.get("name")): i for i in items}
    merged = sorted(unique.values(), key=lambda item: str(item["name"]), reverse=True)
    return _listing(state, merged, headers=fanout.warning(failed))


async def local_listing(state: State, request: web.Request) -> web.Response:
    """This replica's recordings of one machine (the peer port's)."""
    return _listing(state, await _local_items(state, request))


async def _local_items(state: State, request: web.Request) -> list[dict[str, Any]]:
    folder = _folder(state, request)
    return await asyncio.to_thread(_items, folder) if folder is not None else []


def _listing(
    state: State, items: list[dict[str, Any]], *, headers: dict[str, str] | None = None
) -> web.Response:
    body = {
        "kind": "RecordingList",
        "apiVersion": f"{state.config.group}/{state.config.version}",
        "metadata": {},
        "items": items,
    }
    return web.Response(
        body=json.dumps(body, separators=(",", ":")).encode(),
        content_type="application/json",
        headers=headers,
    )


async def one(state: State, request: web.Request) -> web.StreamResponse:
    """One recording file, from this replica or the one that wrote it."""
    try:
        return await local_one(state, request)
    except StatusError as exc:
        if exc.code != 404:
            raise
    name = request.match_info["file"]
    answers = await fanout.ask_others(state, f"{_peer_path(request)}/{name}", limit=MAX_FILE)
    for body in answers.ok.values():
        return web.Response(body=body, headers=_file_headers(name))
    if answers.failed:
        raise StatusError(
            503,
            f'recording "{name}" not found here, and replicas did not answer: '
            + ", ".join(sorted(answers.failed)),
        )
    raise StatusError(404, f'recording "{name}" not found')


async def local_one(state: State, request: web.Request) -> web.StreamResponse:
    """One recording file of this replica."""
    folder = _folder(state, request)
    name = request.match_info["file"]
    path = folder / name if folder is not None and FILE_NAME.match(name) else None
    if path is None or not await asyncio.to_thread(path.is_file):
        raise StatusError(404, f'recording "{name}" not found')
    return web.FileResponse(path, headers=_file_headers(name))


def _file_headers(name: str) -> dict[str, str]:
    return {
        "Content-Type": CONTENT_TYPES[Path(name).suffix],
        "Content-Disposition": f'inline; filename="{name}"',
        "Cache-Control": "no-store",
    }


def _peer_path(request: web.Request) -> str:
    info = request.match_info
    return f"/peer/v1/recordings/{info['resource']}/{info['namespace']}/{info['name']}"


def _folder(state: State, request: web.Request) -> Path | None:
    parent = state.config.parent(request.match_info["resource"])
    if parent is None or not {"console", "vnc"} & set(parent.subresources):
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
    for path in folder.iterdir() if folder.is_dir() else []:
        if not FILE_NAME.match(path.name):
            continue
        try:
            info = path.stat()
            with path.open("rb") as file:
                timestamp, title = _header(path.suffix, file.read(HEADER_BYTES))
        except (OSError, asciicast.RecordingError, displayrec.DisplayRecordingError):
            continue
        items.append(
            {
                "name": path.name,
                "subresource": SUBRESOURCES[path.suffix],
                "size": info.st_size,
                "started": rfc3339(timestamp),
                "modified": rfc3339(info.st_mtime),
                "title": title,
            }
        )
    items.sort(key=lambda item: str(item["name"]), reverse=True)
    return items


def _header(suffix: str, start: bytes) -> tuple[int, str]:
    """A recording's start (Unix seconds) and title, from its first bytes."""
    if suffix == ".display":
        display, _ = displayrec.read_header(start)
        return display.timestamp, display.title
    console, _ = asciicast.read([start.split(b"\n", 1)[0]])
    return console.timestamp, console.title
