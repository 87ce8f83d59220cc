"""The bytes of an aiohttp connection after our own `101 Switching Protocols`.

aiohttp's HTTP parser would read a client's first frame after an upgrade as
a new request. `switch` answers the 101 after installing our own payload
parser on the request's protocol (`internals.take_over`, as aiohttp's own
WebSocket support does), so every byte after the request reaches us, the
ones read together with it included; aiohttp keeps the transport and still
sees the connection close. `UpgradedSocket` is such a parser that hands the
bytes on as a byte carrier (SPDY/3.1); the WebSocket server
(`subres.engine.wsserver`) takes the transport itself once the 101 is out.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Iterable
from typing import Protocol

from aiohttp import web

from subres.engine import internals
from subres.engine.heartbeat import Heartbeat
from subres.engine.stream import linger

__all__ = ["READ_HIGH_WATER", "Parser", "UpgradedSocket", "switch", "upgrade"]

READ_HIGH_WATER = 256 * 1024
"""Bytes received and not yet read before the socket stops reading."""


class Parser(Protocol):
    """What aiohttp's protocol feeds the bytes after the request to."""

    def feed_data(self, data: bytes) -> tuple[bool, bytes]:
        """Take `data`; return `(False, b"")`."""
        ...

    def feed_eof(self) -> None:
        """The connection ended."""
        ...


class UpgradedSocket:
    """A byte carrier over the upgraded connection: read, write with drain, close."""

    def __init__(self, request: web.Request) -> None:
        self._request = request
        transport = request.transport
        if transport is None:
            raise ConnectionResetError("the client went away before the upgrade")
        self._transport = transport
        # Chunks as the transport delivered them, read one at a time: never joined.
        self._chunks: collections.deque[bytes] = collections.deque()
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
        """The next chunk as it arrived; b"" once the client is gone."""
        while not self._chunks and not self._eof:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        if not self._chunks:
            return b""
        data = self._chunks.popleft()
        self._size -= len(data)
        if self._paused and self._size < READ_HIGH_WATER // 2 and not self._transport.is_closing():
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


async def switch(
    request: web.Request, headers: Iterable[tuple[str, str]], parser: Parser
) -> web.StreamResponse:
    """Answer `101` with `headers`; from then on `parser` gets the connection's bytes."""
    response = web.StreamResponse(status=101)
    for name, value in headers:
        response.headers.add(name, value)
    # Neither keep-alive nor a further request: the connection is ours now.
    response.force_close()
    internals.take_over(request, parser)
    await response.prepare(request)
    return response


async def upgrade(
    request: web.Request, headers: Iterable[tuple[str, str]]
) -> tuple[web.StreamResponse, UpgradedSocket]:
    """Answer `101` with `headers` and carry the connection's bytes."""
    socket = UpgradedSocket(request)
    return await switch(request, headers, socket), socket
