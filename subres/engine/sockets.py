"""`SocketStream`: a `ByteStream` over one asyncio transport, as a lean protocol.

Backends (tcp, unix), node-agent relays and the upgrade client's connections
are all this one protocol: chunks handed out as the transport read them,
reading paused above a high-water mark, writes that wait for drain and fail
when the peer takes nothing for too long, and a close that resets a peer
that would not take what is left.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import socket
import struct
from typing import cast

from subres.engine.stream import Chunk

__all__ = ["CLOSE_GRACE", "SocketStream", "Stalled"]

log = logging.getLogger(__name__)

CLOSE_GRACE = 5.0
"""Seconds a closing socket may take to flush before it is aborted."""
_NO_LINGER = struct.pack("ii", 1, 0)


class Stalled(ConnectionError):
    """The peer took none of what was written to it for too long."""


class SocketStream(asyncio.Protocol):
    """A `ByteStream` over a TCP or unix socket, as a lean asyncio protocol.

    Chunks arrive as the transport read them (up to 256 KiB) and are handed out
    without copying; reading pauses while more than `high_water` bytes wait.
    A reset reaches the reader as an error, not as an end; a write that stays
    blocked for `write_timeout` seconds without the backend taking a byte
    fails with `Stalled`.
    One object per connection instead of asyncio's reader, writer and protocol
    trio keeps an idle session small.
    """

    __slots__ = (
        "_abandoned",
        "_chunks",
        "_closed",
        "_drained",
        "_eof",
        "_error",
        "_high_water",
        "_lost",
        "_peer",
        "_read_paused",
        "_readable",
        "_size",
        "_transport",
        "_write_paused",
        "_write_timeout",
    )

    def __init__(self, *, high_water: int, write_timeout: float, peer: str = "backend") -> None:
        self._peer = peer
        self._high_water = high_water
        self._write_timeout = write_timeout
        self._transport: asyncio.Transport | None = None
        self._chunks: collections.deque[bytes] = collections.deque()
        self._size = 0
        self._eof = False
        self._error: Exception | None = None
        self._read_paused = False
        self._write_paused = False
        self._readable: asyncio.Future[None] | None = None
        self._drained: asyncio.Future[None] | None = None
        self._lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._closed = False
        self._abandoned = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Keep the transport."""
        # uvloop's transports are not subclasses of asyncio.Transport, only alike.
        self._transport = cast(asyncio.Transport, transport)

    @property
    def reading(self) -> bool:
        """False while reading is paused because too much waits to be read."""
        return not self._read_paused

    def set_write_high_water(self, high: int) -> None:
        """Let up to `high` bytes queue in the transport before writers wait."""
        if self._transport is not None:
            self._transport.set_write_buffer_limits(high=high)

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
        """The socket is gone (`exc` when it broke): wake every waiter."""
        self._eof = True
        self._error = exc
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
        """The next chunk; b"" at EOF; the error once what came before it is read."""
        while not self._chunks:
            if self._error is not None:
                raise self._error
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
            raise ConnectionResetError(f"{self._peer} connection is closed")
        self._transport.write(data)
        await self._drain(self._transport)

    async def writelines(self, chunks: list[Chunk]) -> None:
        """Write `chunks` in one gathered write (`writev`), then wait as `write` does.

        A subclass whose `write` frames its data must frame these too.
        """
        if self._transport is None or self._transport.is_closing():
            raise ConnectionResetError(f"{self._peer} connection is closed")
        self._transport.writelines(chunks)
        await self._drain(self._transport)

    async def _drain(self, transport: asyncio.Transport) -> None:
        """Wait while the buffer is above its high-water mark and the backend takes bytes."""
        while self._write_paused and not self._lost.done():
            queued = transport.get_write_buffer_size()
            self._drained = asyncio.get_running_loop().create_future()
            try:
                async with asyncio.timeout(self._write_timeout):
                    await self._drained
            except TimeoutError:
                if transport.get_write_buffer_size() >= queued:
                    self._abandoned = True
                    message = f"the {self._peer} took no data for {self._write_timeout:g}s"
                    raise Stalled(message) from None
            except asyncio.CancelledError:
                self._abandoned = True  # the session ended while the backend held us up
                raise
        if self._lost.done():
            raise self._error or ConnectionResetError(f"{self._peer} connection lost")

    async def write_eof(self) -> None:
        """Shut down the sending side, if the transport can."""
        transport = self._transport
        if transport is not None and transport.can_write_eof() and not transport.is_closing():
            with contextlib.suppress(OSError):
                transport.write_eof()

    async def close(self) -> None:
        """Close after flushing what is queued, or abort if the peer does not take it.

        A backend that held a write up until the session ended is aborted at
        once: waiting for it to take the rest would only keep the socket.
        """
        if self._transport is None or self._closed:
            return
        self._closed = True
        if self._abandoned:
            _reset(self._transport)
            return
        self._transport.close()
        try:
            async with asyncio.timeout(CLOSE_GRACE):
                await asyncio.shield(self._lost)
        except TimeoutError:
            _reset(self._transport)
        except asyncio.CancelledError:
            _reset(self._transport)
            raise


def _reset(transport: asyncio.Transport) -> None:
    """Drop the connection with a TCP reset.

    A plain close would leave the kernel trying to deliver what the backend
    does not take (its buffers held for minutes); a zero linger resets it.
    """
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _NO_LINGER)
    transport.abort()


def _wake(waiter: asyncio.Future[None] | None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(None)
