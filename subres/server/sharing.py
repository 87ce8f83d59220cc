"""Which byte stream a console session pumps: its own backend, or a share of the console.

A writer dials the machine's console, and its output also goes to the
console's hub (`sessions.hub.Tee`), where observers read it; a kept console's
writer dials nothing and uses the kept connection (`sessions.hub.KeptPort`).
An observer dials nothing: it reads the hub (`sessions.hub.Feed`), and what it
types is dropped. Every observer, of a console or a display, first takes a
place (`watching`): 429 when its console or the replica has as many as
`session.maxObserversPerConsole` and `session.maxObservers` allow.
"""

from __future__ import annotations

from subres.engine.stream import ByteStream
from subres.kube.status import StatusError
from subres.server import subresource
from subres.server.session import key
from subres.server.state import State
from subres.server.subresource import Target
from subres.sessions.hub import Feed, Hub, KeptPort, Tee
from subres.sessions.observers import Slot, TooManyObservers
from subres.sessions.registry import SessionKey

__all__ = [
    "RETRY_AFTER",
    "hub",
    "keeper_key",
    "keeps_scrollback",
    "key",
    "observe",
    "watching",
    "write",
]

RETRY_AFTER = 5
"""Seconds an observer refused for want of a place is told to wait."""


def keeper_key(target: Target) -> SessionKey:
    """The slot of whoever keeps `target`'s console (which replica, in cluster mode)."""
    console = key(target)
    return SessionKey(console.resource, "console-keeper", console.namespace, console.name)


async def write(state: State, target: Target, url: str, *, tail: int | None) -> ByteStream:
    """The writer's backend: the kept connection, or one dialed (before any upgrade)."""
    kept = state.sessions.hubs.get(key(target))
    if kept is not None and kept.keeper is not None:
        if kept.keeper.backend is None:
            raise StatusError(
                503, f"{target.describe()}: the kept console is not connected: {kept.keeper.status}"
            )
        return KeptPort(kept, kept.keeper, tail=tail)
    if state.sessions.active(keeper_key(target)):
        raise StatusError(503, f"{target.describe()}: another replica keeps this console")
    backend = await subresource.connect(state, target, url)
    return Tee(backend, hub(state, target))


def watching(state: State, target: Target) -> Slot:
    """An observer's place among `target`'s (before anything is dialed or attached)."""
    try:
        return state.observers.take(
            key(target), what=f"the {target.spec.name} of {target.describe()}"
        )
    except TooManyObservers as exc:
        raise StatusError(
            429,
            f"{exc}; try again later",
            details={"retryAfterSeconds": RETRY_AFTER},
            headers=[("Retry-After", str(RETRY_AFTER))],
        ) from None


def observe(state: State, target: Target, *, tail: int | None) -> Feed:
    """An observer's share of the console."""
    return hub(state, target).attach(tail=tail)


def keeps_scrollback(state: State, target: Target) -> bool:
    """Whether `target`'s console is kept here, with output to replay (`?tail=`)."""
    kept = state.sessions.hubs.get(key(target))
    return kept is not None and kept.scrollback is not None


def hub(state: State, target: Target) -> Hub:
    """`target`'s console hub."""
    return state.sessions.hub(key(target), feed_limit=state.config.session.observer_backlog)
