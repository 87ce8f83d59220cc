"""One `log?follow=true` reader of a kept console: its output as it arrives, and when.

A `Follower` is a `Sink` of the console's hub, so it gets every chunk the
moment the keeper delivers it, stamped with the keeper's clock; what waits
for a slow reader is bounded, as an observer's is: `limit` bytes, counting
both what is queued and what its reader took (`next`) but has not sent yet
(`sent`), which is where a reader that stopped reading holds memory. Past it
the follower is cut off: its answer ends with the reason, or, while a send
is stuck on a reader that reads nothing, its connection is dropped. It ends
when the console is let go (no longer kept) and, being a live session of
the registry, when the server drains. Followers hold no slot and are no
`Session` objects (a log is read, as `pods/log` is, not attached to), but
each holds an observer's place (`sessions.observers`).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable

from subres.protocol.channels import TerminalSize
from subres.sessions.hub import amount

__all__ = ["Follower"]

log = logging.getLogger(__name__)


class Follower:
    """What a log follower has yet to send: chunks and when each arrived; None once it ends."""

    def __init__(
        self,
        *,
        limit: int,
        abort: Callable[[], None] = lambda: None,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self._limit = limit
        self._abort = abort
        self._clock = clock
        self._chunks: collections.deque[tuple[bytes, int]] = collections.deque()
        self._size = 0
        self._sending = 0
        """Bytes `next` handed out that the reader has not `sent` yet."""
        self._ended = False
        self._ready = asyncio.Event()
        self.reason = ""
        """Why following ended, once it did."""
        self.cut_off = False
        """It ended because its reader fell too far behind."""

    # -- the hub's Sink ------------------------------------------------------------------

    def output(self, data: bytes) -> None:
        """New output of the console, queued with the time it arrived."""
        if self._ended:
            return
        held = self._size + self._sending
        if held and held + len(data) > self._limit:
            self._fell_behind()
            return
        self._chunks.append((data, self._clock()))
        self._size += len(data)
        self._ready.set()

    def resized(self, size: TerminalSize) -> None:
        """A log has no window."""

    def marker(self, text: str) -> None:
        """Who attaches is no part of the console's output."""

    def let_go(self) -> None:
        """The console is no longer kept: the log ends."""
        self._end("the console is no longer kept")

    # -- a live session of the registry ----------------------------------------------------

    async def close(self, code: int = 1000, reason: str = "") -> None:
        """End following (the server drains)."""
        self._end(reason or "closed")

    def drop(self) -> None:
        """Drop the reader's connection at once (the drain's grace ran out)."""
        self._end("dropped")
        self._abort()

    # -- the reader ------------------------------------------------------------------------

    async def next(self) -> list[tuple[bytes, int]] | None:
        """Everything queued (waiting for some), or None once following ended; counted
        against the limit until `sent`."""
        while not self._chunks:
            if self._ended:
                return None
            self._ready.clear()
            await self._ready.wait()
        batch = list(self._chunks)
        self._chunks.clear()
        self._sending, self._size = self._size, 0
        return batch

    def sent(self) -> None:
        """What `next` handed out has left for the reader."""
        self._sending = 0

    def _fell_behind(self) -> None:
        """Cut off a reader too slow for the console; drop it if a send to it is stuck."""
        stuck = self._sending > 0
        self.cut_off = True
        self._end(f"fell more than {amount(self._limit)} behind the console", discard=True)
        log.info("a log follower was cut off: %s", self.reason)
        if stuck:
            # Its reader takes nothing: the answer can end no other way, and what waits
            # to be sent to it would be held for as long as its connection lasts.
            self._abort()

    def _end(self, reason: str, *, discard: bool = False) -> None:
        """Stop following; what is queued is still read, unless `discard`."""
        if not self._ended:
            self._ended, self.reason = True, reason
            if discard:
                self._chunks.clear()
                self._size = 0
            log.debug("log follower ends: %s", reason)
            self._ready.set()
