"""The `ByteStream` every backend yields, and its socket implementation.

A byte stream is the one shape the pump joins: read until b"" (EOF), write
with backpressure, half-close, close. Socket backends (tcp, unix) are one
asyncio protocol each.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
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


class SocketStream(asyncio.Protocol):
    """A `ByteStream` over a TCP or unix socket, as a lean asyncio protocol.

    Chunks arrive as the transport read them (up to 256 KiB) and are handed out
    without copying; reading pauses while more than `high_water` bytes wait.
    One object per connection instead of asyncio's reader, writer and protocol
    trio keeps an idle session small.
    """

    __slots__ = (
        "_chunks",
        "_closed",
        "_drained",
        "_eof",
        "_high_water",
        "_lost",
        "_read_paused",
        "_readable",
        "_size",
        "_transport",
        "_write_paused",
    )

    def __init__(self, high_water: int) -> None:
        self._high_water = high_water
        self._transport: asyncio.Transport | None = None
        self._chunks: collections.deque[bytes] = collections.deque()
        self._size = 0
        self._eof = False
        self._read_paused = False
        self._write_paused = False
        self._readable: asyncio.Future[None] | None = None
        self._drained: asyncio.Future[None] | None = None
        self._lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Keep the transport."""
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        """Queue a chunk; pause the socket when too much is queued."""
        self._chunks.append(data)
        self._size += len(data)
        if self._size > self._high_water and not self._read_paused and self._transport:
            self._transport.pause_reading()
            self._read_paused = True
        _wake(self._readable)

    def eof_received(self) -> bool:
        """The peer half-closed: keep the socket open so replies can still go out."""
        self._eof = True
        _wake(self._readable)
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        """The socket is gone: wake every waiter."""
        self._eof = True
        _wake(self._readable)
        _wake(self._drained)
        _wake(self._lost)

    def pause_writing(self) -> None:
        """The transport's buffer is above its high-water mark."""
        self._write_paused = True

    def resume_writing(self) -> None:
        """The transport's buffer drained."""
        self._write_paused = False
        _wake(self._drained)

    async def read(self) -> bytes:
        """The next chunk; b"" at EOF or when the connection was reset."""
        while not self._chunks:
            if self._eof:
                return b""
            self._readable = asyncio.get_running_loop().create_future()
            await self._readable
        data = self._chunks.popleft()
        self._size -= len(data)
        if self._read_paused and self._size <= self._high_water // 2 and self._transport:
            self._read_paused = False
            self._transport.resume_reading()
        return data

    async def write(self, data: bytes) -> None:
        """Write, then wait while the transport's buffer is above its high-water mark."""
        if self._transport is None or self._transport.is_closing():
            raise ConnectionResetError("backend connection is closed")
        self._transport.write(data)
        while self._write_paused and not self._lost.done():
            self._drained = asyncio.get_running_loop().create_future()
            await self._drained
        if self._lost.done():
            raise ConnectionResetError("backend connection lost")

    async def write_eof(self) -> None:
        """Shut down the sending side, if the transport can."""
        transport = self._transport
        if transport is not None and transport.can_write_eof() and not transport.is_closing():
            with contextlib.suppress(OSError):
                transport.write_eof()

    async def close(self) -> None:
        """Close after flushing what is queued, or abort if the peer does not take it."""
        if self._transport is None or self._closed:
            return
        self._closed = True
        self._transport.close()
        try:
            async with asyncio.timeout(CLOSE_GRACE):
                await asyncio.shield(self._lost)
        except TimeoutError:
            self._transport.abort()
        except asyncio.CancelledError:
            self._transport.abort()
            raise


def _wake(waiter: asyncio.Future[None] | None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(None)


async def dial(target: Target, *, connect_timeout: float, read_size: int) -> SocketStream:
    """Connect to a vetted target within `connect_timeout` seconds."""
    ep = target.endpoint
    loop = asyncio.get_running_loop()

    def protocol() -> SocketStream:
        return SocketStream(high_water=4 * read_size)

    try:
        async with asyncio.timeout(connect_timeout):
            if ep.scheme == "unix":
                _, stream = await loop.create_unix_connection(protocol, ep.path)
            else:
                _, stream = await loop.create_connection(protocol, target.address, ep.port)
    except TimeoutError:
        message = f"connecting to {ep} timed out after {connect_timeout:g}s"
        raise BackendUnavailable(message) from None
    except OSError as exc:
        raise BackendUnavailable(f"cannot connect to {ep}: {exc.strerror or exc}") from None
    return stream
