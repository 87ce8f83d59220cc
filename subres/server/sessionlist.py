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

import json
import socket
import time
from collections.abc import Iterable
from typing import Any

from aiohttp import web

from subres.kube.status import StatusError
from subres.server import subresource
from subres.server.session import Live, Record
from subres.server.state import State
from subres.server.units import human_age, human_bytes, rfc3339

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
REPLICA = socket.gethostname()


async def for_machine(state: State, request: web.Request) -> web.Response:
    """The live sessions of one machine."""
    parent = state.config.parent(request.match_info["resource"])
    if parent is None:
        raise StatusError(404, f"the server could not find the requested resource {request.path}")
    subresource.lookup(state, request, parent)
    namespace, name = request.match_info["namespace"], request.match_info["name"]
    records = [
        r
        for r in _records(state)
        if r.kind == parent.kind and r.namespace == namespace and r.name == name
    ]
    return _answer(state, request, records)


async def for_namespace(state: State, request: web.Request) -> web.Response:
    """The live sessions in one namespace, or in all of them."""
    namespace = request.match_info.get("namespace")
    if request.query.get("watch", "false").lower() not in ("false", "0"):
        raise StatusError(405, "sessions cannot be watched; list them again instead")
    records = [r for r in _records(state) if namespace is None or r.namespace == namespace]
    return _answer(state, request, records)


def _records(state: State) -> Iterable[Record]:
    for session in state.sessions.live:
        if isinstance(session, Live):
            yield session.record


def _answer(state: State, request: web.Request, records: list[Record]) -> web.Response:
    records.sort(key=lambda r: (r.namespace, r.name, r.started))
    group_version = f"{state.config.group}/{state.config.version}"
    now = time.time()
    items = [item(state, r, group_version=group_version) for r in records]
    if TABLE in request.headers.get("Accept", ""):
        body = _table(items, records, now=now)
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


def item(state: State, record: Record, *, group_version: str) -> dict[str, Any]:
    """A `Session` object for `record`."""
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
        "bytesUp": record.traffic.up,
        "bytesDown": record.traffic.down,
        "recorded": record.recorded,
        "replica": REPLICA,
    }


def _table(items: list[dict[str, Any]], records: list[Record], *, now: float) -> dict[str, Any]:
    columns = [
        {"name": name, "type": kind, "format": fmt, "description": what, "priority": 0}
        for name, kind, fmt, what in COLUMNS
    ]
    rows = [
        {
            "cells": [
                obj["metadata"]["name"],
                r.name,
                r.subresource,
                r.mode,
                r.user,
                r.client,
                human_bytes(r.traffic.up),
                human_bytes(r.traffic.down),
                human_age(now - r.started),
            ],
            "object": {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj["metadata"],
            },
        }
        for obj, r in zip(items, records, strict=True)
    ]
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": ""},
        "columnDefinitions": columns,
        "rows": rows,
    }
