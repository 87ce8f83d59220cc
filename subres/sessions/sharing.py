"""Which byte stream a console or display session pumps on the replica that owns it.

A writer dials the machine's console, and its output also goes to the
console's hub (`sessions.hub.Tee`), where observers read it; a kept console's
writer dials nothing and uses the kept connection (`sessions.hub.KeptPort`).
An observer dials nothing: it reads the hub (`sessions.hub.Feed`), and what it
types is dropped. A display's viewer dials the display through the viewer
guard (`sessions.viewer`).

Every observer, of a console or a display, first takes a place among the
observers this replica serves (`watching`), before anything is attached or
dialed: 429 when its console or display already has
`session.maxObserversPerConsole` of them or the replica `session.maxObservers`.
The place goes back when its backend is closed, which ends every session and
every upgrade that failed.
"""

from __future__ import annotations

from subres.engine.stream import ByteStream
from subres.kube.status import StatusError
from subres.sessions import recorded
from subres.sessions.hub import Feed, Hub, KeptPort, Tee
from subres.sessions.observers import Slot, TooManyObservers
from subres.sessions.runtime import Runtime
from subres.sessions.target import Target, endpoint_url, key
from subres.sessions.viewer import GuardedDisplay

__all__ = [
    "RETRY_AFTER",
    "display",
    "hub",
    "keeps_scrollback",
    "observe",
    "watching",
    "write",
]

RETRY_AFTER = 5
"""Seconds an observer refused for want of a place is told to wait."""


async def write(state: Runtime, target: Target, url: str, *, tail: int | None) -> ByteStream:
    """The writer's backend: the kept connection, or one dialed (before any upgrade)."""
    recorded.check(state, target)  # a recording that cannot be kept: 503, before anything
    kept = state.sessions.hubs.get(key(target))
    if kept is not None and kept.keeper is not None:
        if kept.keeper.backend is None:
            raise StatusError(
                503, f"{target.describe()}: the kept console is not connected: {kept.keeper.status}"
            )
        return KeptPort(kept, kept.keeper, tail=tail)
    backend = await state.backends.connect(target, url)
    return Tee(backend, hub(state, target))


def observe(state: Runtime, target: Target, *, tail: int | None) -> Feed:
    """An observer's share of the console, its place taken (429 when there is none)."""
    recorded.check(state, target)
    place = watching(state, target)
    feed = hub(state, target).attach(tail=tail)
    feed.closed_by(place.release)
    return feed


async def display(state: Runtime, target: Target, *, view_only: bool) -> GuardedDisplay:
    """A viewer's own connection to the display; a view-only one takes its place first."""
    place = watching(state, target) if view_only else None
    try:
        backend = await state.backends.connect(target, endpoint_url(target))
    except BaseException:
        if place is not None:
            place.release()
        raise
    return GuardedDisplay(backend, view_only=view_only, place=place)


def watching(state: Runtime, target: Target) -> Slot:
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


def keeps_scrollback(state: Runtime, target: Target) -> bool:
    """Whether `target`'s console is kept here, with output to replay (`?tail=`)."""
    kept = state.sessions.hubs.get(key(target))
    return kept is not None and kept.scrollback is not None


def hub(state: Runtime, target: Target) -> Hub:
    """`target`'s console hub."""
    return state.sessions.hub(key(target), feed_limit=state.config.session.observer_backlog)
