"""The one lifecycle of every streaming session, whatever its subresource and dialect.

Every handler runs its live part inside `live(...)`, after the upgrade:

    async with session.live(state, request, target=..., dialect=..., client=...) as s:
        await s.run(pump(client, backend, s.record.traffic))

Entering registers the session (an exclusive one takes over its predecessor)
and counts it; `run` awaits the work and keeps its outcome, or that the
client's connection was lost (aiohttp then cancels the handler, and the work
stops both directions as it unwinds); leaving forgets the session, records
how and why it ended (`Record`), updates the metrics and logs one line. This
is the place that audit, observers and Leases hook into.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from subres.server.middleware import USER
from subres.server.state import State
from subres.server.subresource import Target
from subres.streams.pump import Ending, Outcome, Traffic
from subres.streams.sessions import Closable, SessionKey

__all__ = ["Live", "Record", "live"]

log = logging.getLogger(__name__)

LOST = Outcome(Ending.CLIENT, "the client connection was lost")


@dataclass
class Record:
    """What is known of one session: who, what, how much, and how it ended."""

    subresource: str
    dialect: str
    """The negotiated subprotocol or stream protocol; "raw" for none."""
    kind: str
    namespace: str
    name: str
    user: str
    groups: tuple[str, ...]
    client: str
    """The client's address as this server sees it (kube-apiserver's, behind it)."""
    request_id: str
    started: float = field(default_factory=time.time)
    traffic: Traffic = field(default_factory=Traffic)
    outcome: Outcome | None = None
    code: int | None = None
    """The close code sent to the client, when the dialect has one."""
    reason: str = ""
    """Why the session ended, in words."""
    ended: float | None = None

    @property
    def machine(self) -> str:
        """`Machine default/vm1`."""
        return f"{self.kind} {self.namespace}/{self.name}"

    def fields(self) -> dict[str, Any]:
        """The record as flat key/values, for structured logs and audit lines."""
        outcome = self.outcome
        return {
            "subresource": self.subresource,
            "dialect": self.dialect,
            "kind": self.kind,
            "namespace": self.namespace,
            "name": self.name,
            "user": self.user,
            "groups": list(self.groups),
            "client": self.client,
            "requestID": self.request_id,
            "start": self.started,
            "end": self.ended,
            "bytesUp": self.traffic.up,
            "bytesDown": self.traffic.down,
            "endedBy": outcome.ending.value if outcome else None,
            "code": self.code,
            "reason": self.reason,
        }


class Live:
    """A session while it lives: what the registry closes, with its `Record`.

    Enter it (`async with`) once the client is upgraded; `live()` builds it.
    """

    def __init__(
        self, state: State, record: Record, client: Closable, key: SessionKey | None
    ) -> None:
        self.state = state
        self.record = record
        self.client = client
        self.key = key

    async def __aenter__(self) -> Live:
        await self.state.sessions.start(self.key, self, holder=self.record.user)
        self.state.metrics.session_started(self.record.subresource)
        return self

    async def __aexit__(self, *_: object) -> None:
        self.state.sessions.end(self.key, self)
        _finish(self.record, self.client)
        _report(self.state, self.record)

    async def close(self, code: int = 1000, reason: str = "") -> None:
        """Close the client side (a takeover, a shutdown), remembering the code and reason."""
        if self.record.code is None:
            self.record.code = code
            self.record.reason = reason
        await self.client.close(code, reason)

    async def run(self, work: Awaitable[Outcome]) -> Outcome:
        """Run the session's work to its end and keep how it ended.

        aiohttp cancels the handler when the client's connection is lost; the
        work's own cleanup (every pump stops its directions in `finally`)
        runs, and the session is recorded as ended by the client.
        """
        try:
            self.record.outcome = await work
        except asyncio.CancelledError:
            self.record.outcome = LOST
            raise
        return self.record.outcome


def live(
    state: State,
    request: web.Request,
    *,
    target: Target,
    dialect: str,
    client: Closable,
    exclusive: bool = False,
) -> Live:
    """The session of `client`, to enter once upgraded: registered, counted, finally recorded."""
    user = request[USER]
    record = Record(
        subresource=target.spec.name,
        dialect=dialect or "raw",
        kind=target.parent.kind,
        namespace=target.namespace,
        name=target.name,
        user=user.name,
        groups=tuple(user.groups),
        client=request.remote or "",
        request_id=request.headers.get("Audit-Id") or str(uuid.uuid4()),
    )
    key = SessionKey(target.spec.name, target.namespace, target.name) if exclusive else None
    return Live(state, record, client, key)


def _report(state: State, record: Record) -> None:
    ending = record.outcome.ending.value if record.outcome else Ending.ERROR.value
    seconds = (record.ended or record.started) - record.started
    state.metrics.session_ended(
        subresource=record.subresource,
        dialect=record.dialect,
        ending=ending,
        seconds=seconds,
        traffic=record.traffic,
    )
    log.info(
        "%s of %s by %s (%s) ended by %s after %.1fs, %d B up, %d B down: %s",
        record.subresource,
        record.machine,
        record.user,
        record.dialect,
        ending,
        seconds,
        record.traffic.up,
        record.traffic.down,
        record.reason,
        extra={"fields": record.fields()},
    )


def _finish(record: Record, client: Closable) -> None:
    record.ended = time.time()
    if record.code is None:
        # WebSocket clients know the close code sent or received; SPDY has none.
        code = getattr(client, "close_code", None)
        record.code = code if isinstance(code, int) else None
    if not record.reason and record.outcome is not None:
        record.reason = record.outcome.reason
