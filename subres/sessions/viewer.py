"""A VNC viewer's backend connection, with what the viewer sends checked on the way.

Wraps the VNC server's byte stream so that the pump needs nothing special:
writes go through `protocol.rfbguard.ViewerGuard` (shared ClientInit, and for
a view-only viewer no input), reads feed the guard the server's first bytes.
A viewer whose bytes cannot be checked is closed with 1008 and the reason.

`InputWatch` tells when an interactive viewer last gave input (keys, the
pointer, cut text: what a view-only guard would drop), for its idle
timeout; its update requests are not input.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from subres.engine.stream import ByteStream
from subres.engine.websocket import CloseCode
from subres.protocol.rfbguard import ViewerGuard, ViewerRefused
from subres.sessions.hub import Closer
from subres.sessions.observers import Slot

__all__ = ["GuardedDisplay", "InputWatch"]

log = logging.getLogger(__name__)


class GuardedDisplay:
    """The display's `ByteStream` as one viewer may use it."""

    __slots__ = ("_backend", "_closer", "_guard", "_place", "_refused")

    def __init__(self, backend: ByteStream, *, view_only: bool, place: Slot | None = None) -> None:
        self._backend = backend
        self._guard = ViewerGuard(view_only=view_only)
        self._closer: Closer | None = None
        self._refused = False
        self._place = place
        """A view-only viewer's place among the observers, given back at `close`."""

    def attached(self, closer: Closer) -> None:
        """The viewer's session is live; `closer` ends it."""
        self._closer = closer

    async def read(self) -> bytes:
        """The server's next bytes (the guard sees the first ones)."""
        data = await self._backend.read()
        if self._guard.wants_server:
            self._guard.from_server(data)
        return data

    async def write(self, data: bytes) -> None:
        """What of `data` the viewer may send, to the server."""
        if self._refused:
            return
        try:
            allowed = self._guard.from_client(data)
        except ViewerRefused as exc:
            self._refused = True
            log.info("refusing a view-only viewer: %s", exc)
            if self._closer is not None:
                self._closer(CloseCode.POLICY_VIOLATION, str(exc))
            return
        if allowed:
            await self._backend.write(allowed)

    async def write_eof(self) -> None:
        """The viewer is done sending."""
        await self._backend.write_eof()

    async def close(self) -> None:
        """Close the server connection (and give the observer's place back)."""
        if self._place is not None:
            self._place.release()
        await self._backend.close()


class InputWatch:
    """An interactive viewer's stream, its bytes passed untouched and watched for input.

    A view-only guard reads the same bytes beside them: what it would drop is
    input. A viewer it cannot read counts as giving input with every byte,
    so that it is never ended as idle for being unreadable.
    """

    __slots__ = ("_backend", "_input", "_shadow")

    def __init__(self, backend: ByteStream) -> None:
        self._backend = backend
        self._shadow: ViewerGuard | None = ViewerGuard(view_only=True)
        self._input = time.monotonic()

    def last_input(self) -> float:
        """When the viewer last gave input (`time.monotonic()`; its start until then)."""
        return self._input

    def __getattr__(self, name: str) -> Any:
        # What the session asks of a backend (attached, announce, recorded) is the wrapped one's.
        return getattr(self._backend, name)

    async def read(self) -> bytes:
        """The server's next bytes (the watch sees the first ones)."""
        data = await self._backend.read()
        if self._shadow is not None and self._shadow.wants_server:
            self._shadow.from_server(data)
        return data

    async def write(self, data: bytes) -> None:
        """`data` to the server, noting whether it holds input."""
        shadow = self._shadow
        if shadow is not None:
            before = shadow.dropped
            try:
                shadow.from_client(data)
            except ViewerRefused:
                self._shadow = shadow = None
            if shadow is None or shadow.dropped > before:
                self._input = time.monotonic()
        await self._backend.write(data)

    async def write_eof(self) -> None:
        """The viewer is done sending."""
        await self._backend.write_eof()

    async def close(self) -> None:
        """Close the server connection."""
        await self._backend.close()
