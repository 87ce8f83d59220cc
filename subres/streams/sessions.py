"""Live sessions: one interactive session per machine and subresource, and shutdown.

A second console on the same machine takes over: the first client gets a
close frame saying so and naming who took over. On shutdown every live
session is told the server is going away.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from subres.streams.websocket import CloseCode

__all__ = ["Closable", "SessionKey", "Sessions"]


@dataclass(frozen=True)
class SessionKey:
    """Which exclusive session slot: subresource, namespace and machine name."""

    subresource: str
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.subresource} of {self.namespace}/{self.name}"


class Closable(Protocol):
    """What the registry needs of a session: a way to close it with a code and reason."""

    async def close(self, code: int = ..., reason: str = ...) -> None:
        """Close the client side."""


@dataclass
class Sessions:
    """The registry of live sessions."""

    exclusive: dict[SessionKey, Closable] = field(default_factory=dict)
    live: set[Closable] = field(default_factory=set)
    on_ended: Callable[[int], None] | None = None
    """Told how many sessions are still live after one ends (memory reclaim hooks here)."""
    _closing: set[asyncio.Task[None]] = field(default_factory=set)

    def __len__(self) -> int:
        return len(self.live)

    def active(self, key: SessionKey) -> bool:
        """True while an exclusive session holds `key`."""
        return key in self.exclusive

    async def start(self, key: SessionKey | None, session: Closable, *, holder: str) -> None:
        """Register `session`; an exclusive one closes its predecessor, naming `holder`.

        The predecessor closes in the background: its client may be slow to
        answer the close frame, and the new session must not wait for it.
        """
        self.live.add(session)
        if key is None:
            return
        previous = self.exclusive.get(key)
        self.exclusive[key] = session
        if previous is not None:
            reason = f"{key} taken over by {holder}"
            task = asyncio.create_task(previous.close(CloseCode.TAKEN_OVER, reason))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    def end(self, key: SessionKey | None, session: Closable) -> None:
        """Forget `session`."""
        self.live.discard(session)
        if key is not None and self.exclusive.get(key) is session:
            del self.exclusive[key]
        if self.on_ended is not None:
            self.on_ended(len(self.live))

    async def close_all(self, reason: str) -> None:
        """Tell every live client the server is going away."""
        await asyncio.gather(
            *(s.close(CloseCode.GOING_AWAY, reason) for s in list(self.live)),
            return_exceptions=True,
        )
