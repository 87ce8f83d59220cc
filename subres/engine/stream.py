"""The byte stream every copy loop joins, and what a console asks of its backend besides bytes.

A byte stream reads until b"" (EOF), writes with backpressure, half-closes
and closes. Backends (sockets, SSH channels, node agents, other replicas)
implement it; the pump and the session carriers only see this shape.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from subres.protocol.channels import ChannelError, parse_resize

__all__ = ["CLOSE_LINGER", "ByteStream", "Chunk", "Terminal", "linger"]

log = logging.getLogger(__name__)

Chunk = bytes | memoryview
"""Received bytes as a gathering reader hands them on: a view when cut from a larger read."""

CLOSE_LINGER = 5.0
"""Seconds a closing connection waits for the peer to hang up first.

Closing first loses data: a Go peer that sees EOF drops the frames it has read
but not yet handed to its streams (the final exit status among them), and a
peer whose unread bytes meet a closed socket gets a TCP reset.
"""


async def linger(read: Callable[[], Awaitable[bytes]], seconds: float = CLOSE_LINGER) -> None:
    """Read and drop what the peer still sends until it hangs up, at most `seconds`."""
    with contextlib.suppress(TimeoutError, OSError, RuntimeError):
        async with asyncio.timeout(seconds):
            while await read():
                pass


class ByteStream(Protocol):
    """A bidirectional byte stream with half-close."""

    async def read(self) -> bytes:
        """The next chunk, or b"" at EOF."""
        ...

    async def write(self, data: bytes) -> None:
        """Send `data`, waiting while the peer is slow."""
        ...

    async def write_eof(self) -> None:
        """Half-close: the peer sees EOF, replies may still flow back."""
        ...

    async def close(self) -> None:
        """Close both directions and release the connection."""
        ...


class Terminal:
    """What a console client tells its backend besides bytes, and asks of it at the end.

    A backend with a window size (a PTY, an SSH session) has a `resize(size)`
    method; one that runs a command has an `exit_code` attribute, read once
    its output ended. Sockets have neither: resizes are dropped and the exit
    is unknown (None).
    """

    __slots__ = ("_backend",)

    def __init__(self, backend: ByteStream) -> None:
        self._backend = backend

    def resized(self, message: bytes) -> None:
        """A client's resize message (one or more JSON sizes): passed on, or dropped."""
        resize = getattr(self._backend, "resize", None)
        try:
            sizes = parse_resize(message)
        except ChannelError as exc:
            log.debug("ignoring resize: %s", exc)
            return
        if callable(resize):
            for size in sizes:
                resize(size)

    def exit_code(self) -> int | None:
        """The command's exit status, when the backend ran one and it is known."""
        code = getattr(self._backend, "exit_code", None)
        return code if isinstance(code, int) and not isinstance(code, bool) else None
