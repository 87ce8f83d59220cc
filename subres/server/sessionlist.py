"""Who holds a console: the live sessions, as `Session` objects, per machine or per namespace.

`GET …/namespaces/NS/machines/NAME/sessions` (RBAC: `get machines/sessions`),
`GET …/namespaces/NS/sessions` and `GET …/sessions` (RBAC: `list sessions`)
answer a `SessionList`, or a `meta.k8s.io/v1` `Table` when the Accept header
asks for one, as `kubectl get` does. A session says who (user), what
(machine, subresource and which of its consoles or USB slots, mode: writer,
observer, viewer, forwarder or redirector), since when, from where (the
client address this replica saw) and how many bytes went each way so far.
Every session has one front (the replica its client reached), which knows
all of that; the replica asked lists its own and asks
every other replica for theirs (`fanout`), naming any that did not answer in
a `Warning` header.
"""

from __future__ import annotations

import datetime
import json
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from subres.auth import attributes
from subres.kube.status import StatusError
from subres.server import fanout, subresource
from subres.server.state import State
from subres.serving.units import human_age, human_bytes, rfc3339
from subres.sessions.session import Live, Record

__all__ = [
    "COLUMNS",
    "WIDE_COLUMNS",
    "elsewhere",
    "for_machine",
    "for_namespace",
    "fronted",
    "item",
    "unit",
]

TABLE = "as=Table"
COLUMNS = (
    ("Name", "string", "name", "The session's name."),
    ("Machine", "string", "", "The parent object."),
    ("Subresource", "string", "", "console (/its name, when several), vnc, usbredir/slot…"),
    ("Mode", "string", "", "writer, observer, viewer, forwarder or redirector."),
    ("User", "string", "", "Who opened it."),
    ("Client", "string", "", "The client address the session's front replica saw."),
    ("Up", "string", "", "Bytes from the client to the machine so far."),
    ("Down", "string", "", "Bytes from the machine to the client so far."),
    ("Age", "string", "", "Time since the session started."),
)
WIDE_COLUMNS = (
    ("Dialect", "string", "", "The protocol the client speaks (a subprotocol, or spdy)."),
    ("Recorded", "boolean", "", "Whether the session is recorded."),
    ("Replica", "string", "", "The replica that fronts it."),
)
"""Columns of priority 1: what `kubectl get -o wide` adds."""


MAX_LISTING = 64 << 20
"""The largest sessions listing read from another replica."""


async def for_machine(state: State, request: web.Request) -> web.Response:
    """The live sessions of one machine."""
    parent = state.config.parent(request.match_info["resource"])
    if parent is None:
        raise StatusError(404, f"the server could not find the requested resource {request.path}")
    subresource.lookup(state, request, parent)
    namespace, name = request.match_info["namespace"], request.match_info["name"]
    items, failed = await _items(state, Selector(namespace, parent.kind, name))
    consoles = [c.label for c in parent.all_consoles()]
    return _answer(state, request, items, failed, consoles=consoles)


async def for_namespace(state: State, request: web.Request) -> web.Response:
    """The live sessions in one namespace, or in all of them."""
    namespace = request.match_info.get("namespace")
    watch = attributes.parse_bool(request.query.get("watch", "false"))
    if watch is None:
        text = request.query["watch"][:64]
        raise StatusError(400, f"watch must be true or false, not {text!r}")
    if watch:
        raise StatusError(405, "sessions cannot be watched; list them again instead")
    items, failed = await _items(state, Selector(namespace or ""))
    return _answer(state, request, items, failed)


async def fronted(state: State, request: web.Request) -> web.Response:
    """The sessions this replica fronts (the peer port's `GET /peer/v1/sessions`).

    `?namespace=`, `&kind=`, `&name=` and `&user=` select, so that a narrow
    list moves only what it shows.
    """
    query = request.query
    selector = Selector(
        query.get("namespace", ""),
        query.get("kind", ""),
        query.get("name", ""),
        user=query.get("user", ""),
    )
    body = {"items": _local(state, selector)}
    return web.Response(
        body=json.dumps(body, separators=(",", ":")).encode(), content_type="application/json"
    )


@dataclass(frozen=True)
class Selector:
    """Which sessions: of a namespace (all when empty), and of one machine (kind and name)."""

    namespace: str = ""
    kind: str = ""
    name: str = ""
    user: str = ""
    """Whose (all when empty): what `maxSessionsPerUser` counts."""

    def __call__(self, record: Record) -> bool:
        return (
            self.namespace in ("", record.namespace)
            and self.kind in ("", record.kind)
            and self.name in ("", record.name)
            and self.user in ("", record.user)
        )

    def query(self) -> str:
        """The peer request's query string."""
        fields = {
            "namespace": self.namespace,
            "kind": self.kind,
            "name": self.name,
            "user": self.user,
        }
        return urllib.parse.urlencode({k: v for k, v in fields.items() if v})


def _local(state: State, selected: Selector) -> list[dict[str, Any]]:
    group_version = f"{state.config.group}/{state.config.version}"
    return [
        item(state, session.record, group_version=group_version)
        for session in state.sessions.live
        if isinstance(session, Live) and selected(session.record)
    ]


async def elsewhere(state: State, user: str) -> list[tuple[str, str]]:
    """The subresources and modes of `user`'s sessions that other replicas front (those
    that answer)."""
    path = f"/peer/v1/sessions?{Selector(user=user).query()}"
    listed, _ = fanout.listed(state, await fanout.ask_others(state, path, limit=MAX_LISTING), path)
    return [
        (str(i.get("subresource")), str(i.get("mode"))) for i in listed if i.get("user") == user
    ]


async def _items(state: State, selected: Selector) -> tuple[list[dict[str, Any]], list[str]]:
    """Every replica's sessions (each has one front, so none twice), and who did not answer."""
    items = _local(state, selected)
    query = selected.query()
    path = "/peer/v1/sessions" + (f"?{query}" if query else "")
    others, failed = fanout.listed(
        state, await fanout.ask_others(state, path, limit=MAX_LISTING), path
    )
    return items + others, failed


def _answer(
    state: State,
    request: web.Request,
    items: list[dict[str, Any]],
    failed: list[str],
    *,
    consoles: list[str] | None = None,
) -> web.Response:
    """The list (with a machine's: the names of its consoles, the default first)."""
    items.sort(key=lambda i: (i["metadata"]["namespace"], i["parent"]["name"], i["since"]))
    group_version = f"{state.config.group}/{state.config.version}"
    if TABLE in request.headers.get("Accept", ""):
        body = _table(items, now=time.time())
    else:
        body = {
            "kind": "SessionList",
            "apiVersion": group_version,
            "metadata": {"resourceVersion": ""},
            "items": items,
            **({"consoles": consoles} if consoles is not None else {}),
        }
    return web.Response(
        body=json.dumps(body, separators=(",", ":")).encode(),
        content_type="application/json",
        headers=fanout.warning(failed),
    )


def item(state: State, record: Record, *, group_version: str) -> dict[str, Any]:
    """A `Session` object for `record`, a session this replica fronts."""
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
        "unit": unit(state, record),
        "mode": record.mode,
        "user": record.user,
        "dialect": record.dialect,
        "clientAddress": record.client,
        "since": rfc3339(record.started),
        "bytesUp": record.traffic.up,
        "bytesDown": record.traffic.down,
        "recorded": record.recorded,
        "replica": state.replica,
    }


def unit(state: State, record: Record) -> str:
    """Which console or USB slot: its name; the default console's only when there are others."""
    if record.unit or record.subresource != "console":
        return record.unit
    parent = next((p for p in state.config.parents if p.kind == record.kind), None)
    consoles = parent.all_consoles() if parent is not None else ()
    return consoles[0].label if len(consoles) > 1 else ""


def _table(items: list[dict[str, Any]], *, now: float) -> dict[str, Any]:
    columns = [
        {"name": name, "type": kind, "format": fmt, "description": what, "priority": priority}
        for priority, group in enumerate((COLUMNS, WIDE_COLUMNS))
        for name, kind, fmt, what in group
    ]
    rows = [
        {
            "cells": [
                i["metadata"]["name"],
                i["parent"]["name"],
                "/".join(filter(None, (str(i["subresource"]), str(i.get("unit") or "")))),
                i["mode"],
                i["user"],
                i["clientAddress"],
                human_bytes(int(i["bytesUp"])),
                human_bytes(int(i["bytesDown"])),
                human_age(now - _parsed(str(i["since"]), now)),
                i["dialect"],
                i["recorded"],
                i["replica"],
            ],
            "object": {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": i["metadata"],
            },
        }
        for i in items
    ]
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": ""},
        "columnDefinitions": columns,
        "rows": rows,
    }


def _parsed(since: str, now: float) -> float:
    try:
        moment = datetime.datetime.strptime(since, "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return now
    return moment.replace(tzinfo=datetime.UTC).timestamp()
