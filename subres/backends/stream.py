"""The `ByteStream` every backend yields, and its socket implementation.

A byte stream is the one shape the pump joins: read until b"" (EOF), write
with backpressure, half-close, close. Socket backends (tcp, unix) are asyncio
streams underneath.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Protocol

from subres.backends.endpoint import Target

__all__ = ["BackendUnavailable", "ByteStream", "SocketStream", "dial"]

CLOSE_GRACE = 5.0
"""Seconds a closing socket may take to flush before it is aborted."""


class BackendUnavailable(Exception):
    """The backend could not be reached; the message says why."""


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


class SocketStream:
    """A `ByteStream` over an asyncio stream pair."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, read_size: int
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._read_size = read_size

    async def read(self) -> bytes:
        """The next chunk of at most `read_size` bytes; b"" at EOF or on a reset."""
        try:
            return await self._reader.read(self._read_size)
        except OSError:
            return b""

    async def write(self, data: bytes) -> None:
        """Write and wait for the kernel buffer to drain below the high-water mark."""
        self._writer.write(data)
        await self._writer.drain()

    async def write_eof(self) -> None:
        """Shut down the sending side, if the transport can."""
        if self._writer.can_write_eof() and not self._writer.is_closing():
            with contextlib.suppress(OSError):
                self._writer.write_eof()

    async def close(self) -> None:
        """Close after flushing what is queued, or abort if the peer does not take it."""
        self._writer.close()
        try:
            async with asyncio.timeout(CLOSE_GRACE):
                await self._writer.wait_closed()
        except (TimeoutError, OSError):
            self._writer.transport.abort()
        except asyncio.CancelledError:
            self._writer.transport.abort()
            raise


async def dial(target: Target, *, connect_timeout: float, read_size: int) -> SocketStream:
    """Connect to a vetted target within `connect_timeout` seconds."""
    ep = target.endpoint
    limit = 2 * read_size
    try:
        async with asyncio.timeout(connect_timeout):
            if ep.scheme == "unix":
                reader, writer = await asyncio.open_unix_connection(ep.path, limit=limit)
            else:
                reader, writer = await asyncio.open_connection(target.address, ep.port, limit=limit)
    except TimeoutError:
        raise BackendUnavailable(
            f"connecting to {ep} timed out after {connect_timeout:g}s"
        ) from None
    except OSError as exc:
        raise BackendUnavailable(f"cannot connect to {ep}: {exc.strerror or exc}") from None
    sock = writer.get_extra_info("socket")
    if sock is not None and ep.scheme == "tcp":
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return SocketStream(reader, writer, read_size)
