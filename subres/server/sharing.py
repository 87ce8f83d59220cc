"""Which byte stream a console session pumps: its own backend, or a share of the console.

A writer dials the machine's console, and its output also goes to the
console's hub (`streams.hub.Tee`), where observers read it. An observer dials
nothing: it reads the hub (`streams.hub.Feed`), and what it types is dropped.
"""

from __future__ import annotations

from subres.backends.stream import ByteStream
from subres.server import subresource
from subres.server.session import key
from subres.server.state import State
from subres.server.subresource import Target
from subres.streams.hub import Feed, Hub, Tee

__all__ = ["key", "observe", "write"]


async def write(state: State, target: Target, url: str) -> ByteStream:
    """The writer's backend: dialed (before any upgrade), its output shared."""
    backend = await subresource.connect(state, target, url)
    return Tee(backend, _hub(state, target))


def observe(state: State, target: Target, *, tail: int | None) -> Feed:
    """An observer's share of the console."""
    return _hub(state, target).attach(tail=tail)


def _hub(state: State, target: Target) -> Hub:
    return state.sessions.hub(key(target), feed_limit=state.config.session.observer_backlog)
