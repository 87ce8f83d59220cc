"""Live sessions: one interactive session per machine and subresource, and shutdown.

A second console on the same machine takes over: the first client gets a
close frame saying so and naming who took over. A session that asks to
preserve another is refused while one holds the slot. On shutdown every live
session is told the server is going away, and dropped if it does not end in
time.

A session takes its slot in two steps. `claim` runs before the protocol
upgrade, so that a refusal (`Busy`) or a failure to coordinate is still an
HTTP `Status`; it takes the slot over at once. `start` binds the upgraded
session to its claim; `end` unbinds it and `release` gives the slot up.

Observers are live sessions without a slot: they read a console's `Hub`,
which outlives any one writer (`hubs`, made on demand, forgotten when idle).

Slots are held only by the replica that owns their unit
(`sessions.members`); sessions fronted elsewhere hold theirs here through a
peer session (`sessions.peer`). When the members change, `moved` ends the
sessions of the units this replica no longer owns.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

from subres.engine.websocket import CloseCode
from subres.sessions.hub import Hub
from subres.sessions.moderation import Gate

__all__ = [
    "OWNED_TOGETHER",
    "UNIT_WORDS",
    "Busy",
    "Claim",
    "Closable",
    "LiveSession",
    "SessionKey",
    "Sessions",
]


UNIT_WORDS = {"usbredir": "slot "}
"""How a unit is named in words where its bare name says too little (`usbredir slot 0`)."""
OWNED_TOGETHER = frozenset({"usbredir"})
"""Subresources whose units of one machine one replica owns together (it picks among them)."""


@dataclass(frozen=True)
class SessionKey:
    """One unit of a machine: a console (by name), its display, a USB slot.

    A unit is one exclusive session slot, and what one replica owns
    (`sessions.members`): every replica derives the same owner from it. Build
    it from a request's target with `sessions.target.key`, the one place.
    """

    resource: str
    """The parent's resource (`machines`): a Host and a Machine of one name are two slots."""
    subresource: str
    namespace: str
    name: str
    unit: str = ""
    """Which of the machine's units of this subresource: a console's name (`serial1`), a
    usbredir slot's number (`0`); "" for a machine's only one, or its default console."""

    def role(self, subresource: str) -> SessionKey:
        """The same unit under another slot name (`console-keeper`: who keeps a console)."""
        return replace(self, subresource=subresource)

    def __str__(self) -> str:
        what = self.subresource
        if self.unit:
            what += f" {UNIT_WORDS.get(self.subresource, '')}{self.unit}"
        return f"{what} of {self.namespace}/{self.name}"

    def hashed(self) -> bytes:
        """The key as bytes for rendezvous hashing: the same on every replica.

        A machine's USB slots are owned together: one replica chooses among them.
        """
        unit = "" if self.subresource in OWNED_TOGETHER else self.unit
        parts = (self.resource, self.subresource, self.namespace, self.name, unit)
        return "\0".join(parts).encode()


class Closable(Protocol):
    """A client side that can be closed with a code and reason."""

    async def close(self, code: int = ..., reason: str = ...) -> None:
        """Close the client side."""


class LiveSession(Closable, Protocol):
    """What the registry needs of a session: ways to end it, politely or not."""

    def drop(self) -> None:
        """Drop the client's connection at once, without a goodbye (shutdown's last resort)."""


class Busy(Exception):
    """A session asked to preserve another while the slot is held."""

    def __init__(self, key: SessionKey) -> None:
        super().__init__(f"{key} is held by another session")
        self.key = key


@dataclass(eq=False)
class Claim:
    """One session's hold on an exclusive slot, from before its upgrade to its end."""

    key: SessionKey
    user: str
    """Who asked: named to the session this one takes over."""
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    """Unique per session; the Lease's holder identity carries it."""
    session: LiveSession | None = None
    """The upgraded session, once `start` bound it."""
    lost: str | None = None
    """Why the slot was taken from this claim, once it was."""
    took_over: str = ""
    """Whose session this claim took the slot from, when it took one here."""
    since: float = field(default_factory=time.monotonic)
    """When the claim was made (the local clock): the oldest is taken over first."""


@dataclass
class Sessions:
    """The registry of live sessions and of the claims on exclusive slots."""

    exclusive: dict[SessionKey, Claim] = field(default_factory=dict)
    live: set[LiveSession] = field(default_factory=set)
    hubs: dict[SessionKey, Hub] = field(default_factory=dict)
    """Consoles with observers, a writer that observers may join, or a keeper."""
    gates: dict[SessionKey, Gate] = field(default_factory=dict)
    """Consoles and displays with moderators or moderated sessions."""
    on_ended: Callable[[int], None] | None = None
    """Told how many sessions are still live after one ends (memory reclaim hooks here)."""
    _closing: set[asyncio.Task[None]] = field(default_factory=set)
    _idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self._idle.set()

    def __len__(self) -> int:
        return len(self.live)

    def active(self, key: SessionKey) -> bool:
        """True while a session holds `key` (on this replica, which owns it)."""
        return key in self.exclusive

    def since(self, key: SessionKey) -> float | None:
        """When this replica's session on `key` claimed it (the local clock); None if none does."""
        claim = self.exclusive.get(key)
        return claim.since if claim is not None else None

    async def claim(self, key: SessionKey, *, user: str, preserve: bool = False) -> Claim:
        """Take the slot `key` for a new session of `user`, taking it from any holder.

        With `preserve`, raise `Busy` instead while another session holds it.
        """
        if preserve and self.active(key):
            raise Busy(key)
        claim = Claim(key, user)
        previous = self.exclusive.get(key)
        self.exclusive[key] = claim
        if previous is not None:
            claim.took_over = previous.user
            self.taken_over(previous, user)
        return claim

    def start(self, claim: Claim | None, session: LiveSession) -> None:
        """Register `session`, bound to `claim`; closed at once if its slot was taken meanwhile."""
        self.live.add(session)
        self._idle.clear()
        if claim is None:
            return
        claim.session = session
        if claim.lost is not None:
            self._close(session, CloseCode.TAKEN_OVER, claim.lost)

    def end(self, claim: Claim | None, session: LiveSession) -> None:
        """Forget `session`."""
        self.live.discard(session)
        if not self.live:
            self._idle.set()
        if claim is not None and claim.session is session:
            claim.session = None
        if self.on_ended is not None:
            self.on_ended(len(self.live))

    def release(self, claim: Claim) -> None:
        """Give up `claim`'s slot unless another session took it since."""
        if self.exclusive.get(claim.key) is claim:
            del self.exclusive[claim.key]

    def taken_over(self, claim: Claim, by: str) -> None:
        """Another session, of `by`, took `claim`'s slot: close its session, saying so.

        The session closes in the background: its client may be slow to
        answer the close frame, and the new session must not wait for it.
        """
        if claim.lost is not None:
            return
        claim.lost = f"{claim.key} taken over by {by}"
        if self.exclusive.get(claim.key) is claim:
            del self.exclusive[claim.key]
        if claim.session is not None:
            self._close(claim.session, CloseCode.TAKEN_OVER, claim.lost)

    def moved(self, mine: Callable[[SessionKey], bool], reason: str) -> None:
        """The members changed: end (1001) every session on a unit this replica no longer owns.

        Their clients reconnect, through whichever replica, to the new owner.
        """
        for key, claim in list(self.exclusive.items()):
            if not mine(key) and claim.lost is None:
                claim.lost = reason
                del self.exclusive[key]
                if claim.session is not None:
                    self._close(claim.session, CloseCode.GOING_AWAY, reason)
        for key, hub in list(self.hubs.items()):
            if not mine(key):
                for feed in list(hub.feeds):
                    feed.cut(reason, code=CloseCode.GOING_AWAY)

    def hub(self, key: SessionKey, *, feed_limit: int) -> Hub:
        """The console `key`'s hub, made when first asked for and forgotten when idle.

        `feed_limit`: bytes an observer of a new hub may fall behind.
        """
        hub = self.hubs.get(key)
        if hub is None:
            hub = Hub(on_idle=lambda idle: self._forget(key, idle), feed_limit=feed_limit)
            self.hubs[key] = hub
        return hub

    def gate(self, key: SessionKey, *, note: Callable[[str], None]) -> Gate:
        """The unit `key`'s moderation gate, made when first asked for and forgotten when idle.

        `note` writes a line into the unit's recording.
        """
        gate = self.gates.get(key)
        if gate is None:
            gate = Gate(on_idle=lambda idle: self._forget_gate(key, idle), note=note)
            self.gates[key] = gate
        return gate

    def _forget_gate(self, key: SessionKey, gate: Gate) -> None:
        if self.gates.get(key) is gate:
            del self.gates[key]

    def _forget(self, key: SessionKey, hub: Hub) -> None:
        if self.hubs.get(key) is hub:
            del self.hubs[key]

    def close_later(self, session: Closable, code: int, reason: str) -> None:
        """Close `session` in the background (its client may be slow to answer)."""
        self._close(session, code, reason)

    async def close_all(self, reason: str) -> None:
        """Tell every live client the server is going away."""
        await asyncio.gather(
            *(s.close(CloseCode.GOING_AWAY, reason) for s in list(self.live)),
            return_exceptions=True,
        )

    async def ended(self) -> None:
        """Return once no session is live."""
        await self._idle.wait()

    def drop_all(self) -> None:
        """Drop every live session's connection at once."""
        for session in list(self.live):
            session.drop()

    def _close(self, session: Closable, code: int, reason: str) -> None:
        task = asyncio.create_task(session.close(code, reason))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
