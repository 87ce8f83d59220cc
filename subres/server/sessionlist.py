"""Who holds a console: the live sessions, as `Session` objects, per machine or per namespace.

`GET …/namespaces/NS/machines/NAME/sessions` (RBAC: `get machines/sessions`),
`GET …/namespaces/NS/sessions` and `GET …/sessions` (RBAC: `list sessions`)
answer a `SessionList`, or a `meta.k8s.io/v1` `Table` when the Accept header
asks for one, as `kubectl get` does. A session says who (user), what
(machine, subresource, mode: writer, observer, viewer or forwarder), since
when, from where (the client address this replica saw) and how many bytes
went each way so far. Each replica lists the sessions it serves.
"""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple, Protocol, runtime_checkable

from aiohttp import web

from subres.auth import attributes
from subres.kube.status import StatusError
from subres.server import subresource
from subres.server.session import Live, Record
from subres.server.state import State
from subres.serving.units import human_age, human_bytes, rfc3339
from subres.sessions.leases import USER_ANNOTATION

__all__ = ["COLUMNS", "for_machine", "for_namespace", "item"]

TABLE = "as=Table"
COLUMNS = (
    ("Name", "string", "name", "The session's name."),
    ("Machine", "string", "", "The parent object."),
    ("Subresource", "string", "", "console, vnc or portforward."),
    ("Mode", "string", "", "writer, observer, viewer or forwarder."),
    ("User", "string", "", "Who opened it."),
    ("Client", "string", "", "The client address this replica saw."),
    ("Up", "string", "", "Bytes from the client to the machine so far."),
    ("Down", "string", "", "Bytes from the machine to the client so far."),
    ("Age", "string", "", "Time since the session started."),
)


HOLDERS = {"console": "writer", "vnc": "viewer"}
"""The slots whose Leases name a session of another replica, and its mode."""


@runtime_checkable
class Holders(Protocol):
    """Session Leases, as the replicas' shared lock has seen them."""

    def holders(self) -> list[Mapping[str, Any]]:
        """The fresh session Leases."""
        ...


class Entry(NamedTuple):
    """A session: its record, the replica serving it, whether its traffic is known here."""

    record: Record
    replica: str
    local: bool


async def for_machine(state: State, request: web.Request) -> web.Response:
    """The live sessions of one machine."""
    parent = state.config.parent(request.match_info["resource"])
    if parent is None:
        raise StatusError(404, f"the server could not find the requested resource {request.path}")
    subresource.lookup(state, request, parent)
    namespace, name = request.match_info["namespace"], request.match_info["name"]
    entries = [
        e
        for e in _entries(state)
        if (e.record.kind, e.record.namespace, e.record.name) == (parent.kind, namespace, name)
    ]
    return _answer(state, request, entries)


async def for_namespace(state: State, request: web.Request) -> web.Response:
    """The live sessions in one namespace, or in all of them."""
    namespace = request.match_info.get("namespace")
    watch = attributes.parse_bool(request.query.get("watch", "false"))
    if watch is None:
        text = request.query["watch"][:64]
        raise StatusError(400, f"watch must be true or false, not {text!r}")
    if watch:
        raise StatusError(405, "sessions cannot be watched; list them again instead")
    entries = [e for e in _entries(state) if namespace in (None, e.record.namespace)]
    return _answer(state, request, entries)


def _entries(state: State) -> Iterable[Entry]:
    for session in state.sessions.live:
        if isinstance(session, Live):
            yield Entry(session.record, state.replica, local=True)
    shared = state.sessions.shared
    if isinstance(shared, Holders):
        for lease in shared.holders():
            remote = _remote(state, lease)
            if remote is not None:
                yield remote


def _remote(state: State, lease: Mapping[str, Any]) -> Entry | None:
    """A session another replica serves, from its Lease (None: ours, or not a session's)."""
    notes = (lease.get("metadata") or {}).get("annotations") or {}
    spec = lease.get("spec") or {}
    replica, _, claim = str(spec.get("holderIdentity") or "").partition("/")
    sub = str(notes.get("subres.dev/subresource") or "")
    parent = state.config.parent(str(notes.get("subres.dev/resource") or ""))
    if replica == state.replica or sub not in HOLDERS or parent is None:
        return None
    record = Record(
        subresource=sub,
        mode=HOLDERS[sub],
        dialect="",
        kind=parent.kind,
        namespace=str(notes.get("subres.dev/namespace") or ""),
        name=str(notes.get("subres.dev/name") or ""),
        user=str(notes.get(USER_ANNOTATION) or ""),
        groups=(),
        client="",
        request_id="",
        id=claim or "0" * 8,
        started=_micro_time(str(spec.get("acquireTime") or "")),
    )
    return Entry(record, replica, local=False)


def _micro_time(text: str) -> float:
    try:
        moment = datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ")
    except ValueError:
        return time.time()
    return moment.replace(tzinfo=datetime.UTC).timestamp()


def _answer(state: State, request: web.Request, entries: list[Entry]) -> web.Response:
    entries.sort(key=lambda e: (e.record.namespace, e.record.name, e.record.started))
    group_version = f"{state.config.group}/{state.config.version}"
    items = [item(state, e, group_version=group_version) for e in entries]
    if TABLE in request.headers.get("Accept", ""):
        body = _table(items, entries, now=time.time())
    else:
        body = {
            "kind": "SessionList",
            "apiVersion": group_version,
            "metadata": {"resourceVersion": ""},
            "items": items,
        }
    return web.Response(
        body=json.dumps(body, separators=(",", ":")).encode(), content_type="application/json"
    )


def item(state: State, entry: Entry, *, group_version: str) -> dict[str, Any]:
    """A `Session` object for `entry`; traffic is null for another replica's session."""
    record = entry.record
    parent = next((p for p in state.config.parents if p.kind == record.kind), None)
    return {
        "kind": "Session",
        "apiVersion": group_version,
        "metadata": {
            "name": f"{record.name}-{record.subresource}-{record.id[:8]}",
            "namespace": record.namespace,
            "uid": record.id,
            "creationTimestamp": rfc3339(record.started),
        },
        "parent": {
            "apiVersion": parent.api_version if parent else "",
            "kind": record.kind,
            "name": record.name,
        },
        "subresource": record.subresource,
        "mode": record.mode,
        "user": record.user,
        "dialect": record.dialect,
        "clientAddress": record.client,
        "since": rfc3339(record.started),
        "bytesUp": record.traffic.up if entry.local else None,
        "bytesDown": record.traffic.down if entry.local else None,
        "recorded": record.recorded,
        "replica": entry.replica,
    }


def _table(items: list[dict[str, Any]], entries: list[Entry], *, now: float) -> dict[str, Any]:
    columns = [
        {"name": name, "type": kind, "format": fmt, "description": what, "priority": 0}
        for name, kind, fmt, what in COLUMNS
    ]
    rows = [
        {
            "cells": [
                obj["metadata"]["name"],
                e.record.name,
                e.record.subresource,
                e.record.mode,
                e.record.user,
                e.record.client or f"(on {e.replica})",
                human_bytes(e.record.traffic.up) if e.local else "-",
                human_bytes(e.record.traffic.down) if e.local else "-",
                human_age(now - e.record.started),
            ],
            "object": {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj["metadata"],
            },
        }
        for obj, e in zip(items, entries, strict=True)
    ]
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": ""},
        "columnDefinitions": columns,
        "rows": rows,
    }
