"""Reading recorded sessions through the API, under RBAC, never through the files.

`GET …/namespaces/NS/machines/NAME/recordings` answers a `RecordingList`
(each file's name, subresource, size, start and title), console and display
recordings together; `GET …/recordings/FILE` answers the file itself
(`application/x-asciicast`, or `application/vnd.subres.display-recording`
for `protocol.displayrec`). Both are authorized
as `get machines/recordings` on that machine, as kube-apiserver authorized
them before proxying. A recording is served only under the parent it
belongs to: the object the URL names must exist (404 otherwise), and only
the recordings of that kind and that object (its uid: not a deleted
namesake's) are read. A namespace or name that cannot be one is a 400;
files are opened with no link followed (`sessions.recordfiles`).

Each replica writes the recordings of the consoles it owns; a listing asks
every replica (`fanout`) and merges by name, and a file this replica does not
have is fetched from the one that has it, so any replica serves any
recording whether the directory is shared or each replica has its own.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import PurePath
from typing import Any

from aiohttp import web

from subres.kube.status import StatusError
from subres.protocol import asciicast, displayrec
from subres.server import fanout, subresource
from subres.server.state import State
from subres.serving.units import rfc3339
from subres.sessions import recordfiles

__all__ = ["DISPLAY_TYPE", "listing", "local_listing", "local_one", "one"]

DISPLAY_TYPE = "application/vnd.subres.display-recording"
CONTENT_TYPES = {".cast": "application/x-asciicast", ".display": DISPLAY_TYPE}
SUBRESOURCES = {".cast": "console", ".display": "vnc"}
CHUNK = 64 << 10


MAX_LISTING = 16 << 20
"""The largest recordings listing read from another replica."""
MAX_FILE = 1 << 30
"""The largest recording read from another replica."""


async def listing(state: State, request: web.Request) -> web.Response:
    """The recordings of one machine on every replica, newest first."""
    items = await _local_items(state, request)
    path = _peer_path(request)
    others, failed = fanout.listed(
        state, await fanout.ask_others(state, path, limit=MAX_LISTING), path
    )
    items += others
    # A shared directory (ReadWriteMany) shows every file on every replica: once each.
    unique = {str(i.get("name")): i for i in items}
    merged = sorted(unique.values(), key=_newest_first, reverse=True)
    return _listing(state, merged, headers=fanout.warning(failed))


async def local_listing(state: State, request: web.Request) -> web.Response:
    """This replica's recordings of one machine (the peer port's)."""
    return _listing(state, await _local_items(state, request))


async def _local_items(state: State, request: web.Request) -> list[dict[str, Any]]:
    # Checked before asking anyone: a name that cannot be one, or no such object.
    where = _folder(state, request)
    return await asyncio.to_thread(_items, state, where) if where is not None else []


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
        # A cut answer is one of these: a recording is served whole or not at all.
        raise StatusError(
            503,
            f'recording "{name}" not found here, and replicas did not answer: '
            + ", ".join(f"{m} ({answers.failed[m]})" for m in sorted(answers.failed)),
        )
    raise StatusError(404, f'recording "{name}" not found')


async def local_one(state: State, request: web.Request) -> web.StreamResponse:
    """One recording file of this replica, streamed as it is read."""
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
        response = web.StreamResponse(headers=_file_headers(name))
        await response.prepare(request)
        while chunk := await asyncio.to_thread(file.read, CHUNK):
            await response.write(chunk)
        await response.write_eof()
        return response
    finally:
        file.close()


def _file_headers(name: str) -> dict[str, str]:
    return {
        "Content-Type": CONTENT_TYPES[PurePath(name).suffix],
        "Content-Disposition": f'inline; filename="{name}"',
        "Cache-Control": "no-store",
    }


def _peer_path(request: web.Request) -> str:
    info = request.match_info
    return f"/peer/v1/recordings/{info['resource']}/{info['namespace']}/{info['name']}"


def _folder(state: State, request: web.Request) -> recordfiles.Folder | None:
    """The folder of the object the URL names (400, 404, 503 as Status); None unrecorded."""
    parent = state.config.parent(request.match_info["resource"])
    if parent is None or not {"console", "vnc"} & set(parent.subresources):
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
        suffix = PurePath(file.name).suffix
        try:
            timestamp, title = _header(suffix, store.start(where, file.name))
        except (OSError, asciicast.RecordingError, displayrec.DisplayRecordingError):
            continue
        items.append(
            {
                "name": file.name,
                "subresource": SUBRESOURCES[suffix],
                "size": file.size,
                "started": rfc3339(timestamp),
                "modified": rfc3339(file.mtime, fraction=True),
                "title": title,
            }
        )
    items.sort(key=_newest_first, reverse=True)
    return items


def _newest_first(item: dict[str, Any]) -> tuple[str, str, str]:
    """Order by start (the name's stamp, to the second), then by last write: of two
    recordings started in the same second one after the other, the later one."""
    name = str(item["name"])
    return name[: len("20060102T150405Z")], str(item.get("modified", "")), name


def _header(suffix: str, start: bytes) -> tuple[int, str]:
    """A recording's start (Unix seconds) and title, from its first bytes."""
    if suffix == ".display":
        display, _ = displayrec.read_header(start)
        return display.timestamp, display.title
    console, _ = asciicast.read([start.split(b"\n", 1)[0]])
    return console.timestamp, console.title
