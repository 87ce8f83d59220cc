"""The raw bytes of an aiohttp connection after our own `101 Switching Protocols`.

aiohttp upgrades WebSockets itself but knows nothing of SPDY/3.1: its HTTP
parser would read the client's first SPDY frame as a new request. As
aiohttp's `WebSocketResponse` does, we install our own payload parser on the
request's protocol BEFORE the 101 goes out (`internals.take_over`), so every
byte after the request reaches us; aiohttp keeps the transport and still sees
the connection close.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from aiohttp import web

from subres.engine import internals
from subres.engine.heartbeat import Heartbeat
from subres.engine.stream import linger

__all__ = ["READ_HIGH_WATER", "UpgradedSocket", "upgrade"]

READ_HIGH_WATER = 256 * 1024
"""Bytes received and not yet read before the socket stops reading."""


class UpgradedSocket:
    """A byte carrier over the upgraded connection: read, write with drain, close."""

    def __init__(self, request: web.Request) -> None:
        self._request = request
        transport = request.transport
        if transport is None:
            raise ConnectionResetError("the client went away before the upgrade")
        self._transport = transport
        # Chunks as the transport delivered them, joined only when read.
        self._chunks: list[bytes] = []
        self._size = 0
        self._eof = False
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False
        self._heartbeat: Heartbeat | None = None
        self.silent = ""
        """Why the other end was given up for silent (`start_heartbeat`), if it was."""

    def start_heartbeat(self, interval: float, frame: bytes) -> None:
        """Send `frame` every `interval` seconds; drop the connection once the other end
        fell silent (`engine.heartbeat`)."""

        def beat() -> None:
            transport = self._transport
            if not transport.is_closing() and not transport.get_write_buffer_size():
                transport.write(frame)

        self._heartbeat = Heartbeat(
            interval, beat=beat, expire=self._silent, reading=lambda: not self._paused
        )
        self._heartbeat.start()

    def _silent(self, why: str) -> None:
        self.silent = why
        self._transport.abort()

    # aiohttp's protocol calls these two as a payload parser's.
    def feed_data(self, data: bytes) -> tuple[bool, bytes]:
        """Bytes from the client; reading pauses while too many wait."""
        if self._heartbeat is not None:
            self._heartbeat.heard()
        self._chunks.append(data)
        self._size += len(data)
        if self._size >= READ_HIGH_WATER and not self._paused:
            self._paused = True
            self._transport.pause_reading()
        self._wake()
        return False, b""

    def feed_eof(self) -> None:
        """The connection is gone."""
        self._eof = True
        if self._heartbeat is not None:
            self._heartbeat.stop()
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def read(self) -> bytes:
        """What arrived since the last read; b"" once the client is gone."""
        while not self._chunks and not self._eof:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        chunks = self._chunks
        if not chunks:
            data = b""
        elif len(chunks) == 1:
            data = bytes(chunks[0])
        else:
            data = b"".join(chunks)
        self._chunks = []
        self._size = 0
        if self._paused and not self._transport.is_closing():
            self._paused = False
            self._transport.resume_reading()
        return data

    async def write(self, data: bytes) -> None:
        """Send `data`, waiting while the transport's buffer is above its high-water mark."""
        if self._transport.is_closing():
            raise ConnectionResetError("the client connection is closed")
        self._transport.write(data)
        # aiohttp's own writers wait for drain this way (pause_writing/resume_writing).
        await internals.drain(self._request)

    def end(self, last: bytes) -> None:
        """Send `last` without waiting and close (the peer is told, not waited for)."""
        if not self._transport.is_closing():
            self._transport.write(last)
            self._transport.close()

    async def close(self) -> None:
        """Let the peer hang up first (within `stream.CLOSE_LINGER`), then close."""
        await linger(self.read)
        if self._heartbeat is not None:
            self._heartbeat.stop()
        self._transport.close()


async def upgrade(
    request: web.Request, headers: Iterable[tuple[str, str]]
) -> tuple[web.StreamResponse, UpgradedSocket]:
    """Answer `101` with `headers` and take over the connection's bytes."""
    response = web.StreamResponse(status=101)
    for name, value in headers:
        response.headers.add(name, value)
    # Neither keep-alive nor a further request: the connection is ours now.
    response.force_close()
    socket = UpgradedSocket(request)
    internals.take_over(request, socket)
    await response.prepare(request)
    return response, socket
