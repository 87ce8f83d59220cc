"""Reading recorded console sessions through the API, under RBAC, never through the files.

`GET …/namespaces/NS/{resource}/NAME/recordings` answers a `RecordingList`
(each file's name, size, start and title); `GET …/recordings/FILE` answers
the asciicast file itself (`application/x-asciicast`). Both are authorized as
`get {resource}/recordings` on that object, as kube-apiserver authorized them
before proxying. A recording is served only under the parent it belongs to:
the object the URL names must exist (404 otherwise), and only the recordings
of that kind and that object (its uid: not a deleted namesake's) are read.
A namespace or name that cannot be one is a 400; files are opened with no
link followed (`sessions.recordfiles`).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from subres.kube.status import StatusError
from subres.protocol import asciicast
from subres.server import subresource
from subres.server.state import State
from subres.serving.units import rfc3339
from subres.sessions import recordfiles

__all__ = ["listing", "one"]

CONTENT_TYPE = "application/x-asciicast"
CHUNK = 64 << 10


async def listing(state: State, request: web.Request) -> web.Response:
    """The recordings of one object, newest first."""
    where = _folder(state, request)
    items = await asyncio.to_thread(_items, state, where) if where is not None else []
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
    """One recording file, streamed as it is read."""
    where = _folder(state, request)
    name = request.match_info["file"]
    store = state.recordings.store
    if where is None or store is None or not recordfiles.FILE_NAME.match(name):
        raise StatusError(404, f'recording "{name[:128]}" not found')
    try:
        file = await asyncio.to_thread(store.open, where, name)
    except FileNotFoundError:
        raise StatusError(404, f'recording "{name}" not found') from None
    try:
        response = web.StreamResponse(
            headers={
                "Content-Type": CONTENT_TYPE,
                "Content-Disposition": f'inline; filename="{name}"',
                "Cache-Control": "no-store",
            }
        )
        await response.prepare(request)
        while chunk := await asyncio.to_thread(file.read, CHUNK):
            await response.write(chunk)
        await response.write_eof()
        return response
    finally:
        file.close()


def _folder(state: State, request: web.Request) -> recordfiles.Folder | None:
    """The folder of the object the URL names (400, 404, 503 as Status); None unrecorded."""
    parent = state.config.parent(request.match_info["resource"])
    if parent is None or "console" not in parent.subresources:
        raise StatusError(404, f"the server could not find the requested resource {request.path}")
    namespace, name = request.match_info["namespace"], request.match_info["name"]
    try:
        recordfiles.folder(namespace=namespace, resource=parent.resource, name=name, uid="")
    except ValueError as exc:
        raise StatusError(400, str(exc)) from None
    obj = subresource.lookup(state, request, parent)
    if state.recordings.store is None:
        return None
    uid = str((obj.get("metadata") or {}).get("uid") or "")
    return recordfiles.folder(namespace=namespace, resource=parent.resource, name=name, uid=uid)


def _items(state: State, where: recordfiles.Folder) -> list[dict[str, Any]]:
    store = state.recordings.store
    assert store is not None
    items = []
    for file in store.files(where):
        try:
            header, _ = asciicast.read([store.head(where, file.name)])
        except (OSError, asciicast.RecordingError):
            continue
        items.append(
            {
                "name": file.name,
                "size": file.size,
                "started": rfc3339(header.timestamp),
                "modified": rfc3339(file.mtime),
                "title": header.title,
            }
        )
    items.sort(key=lambda item: str(item["name"]), reverse=True)
    return items
