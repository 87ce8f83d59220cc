"""Which byte stream a console session pumps on the replica that owns the console.

A writer dials the machine's console, and its output also goes to the
console's hub (`sessions.hub.Tee`), where observers read it; a kept console's
writer dials nothing and uses the kept connection (`sessions.hub.KeptPort`).
An observer dials nothing: it reads the hub (`sessions.hub.Feed`), and what it
types is dropped.
"""

from __future__ import annotations

from subres.engine.stream import ByteStream
from subres.kube.status import StatusError
from subres.sessions.hub import Feed, Hub, KeptPort, Tee
from subres.sessions.runtime import Runtime
from subres.sessions.target import Target, key

__all__ = ["hub", "observe", "write"]


async def write(state: Runtime, target: Target, url: str, *, tail: int | None) -> ByteStream:
    """The writer's backend: the kept connection, or one dialed (before any upgrade)."""
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
    """An observer's share of the console."""
    return hub(state, target).attach(tail=tail)


def hub(state: Runtime, target: Target) -> Hub:
    """`target`'s console hub."""
    return state.sessions.hub(key(target), feed_limit=state.config.session.observer_backlog)
