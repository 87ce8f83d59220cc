"""A SPDY/3.1 client made from our own codec, for the edge cases client-go never produces.

It upgrades over TLS (or tunnels through a WebSocket), then exposes the codec:
`open` a stream, `send` data, and `expect` events. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TypeVar

import aiohttp

from subres.protocol.spdy import Event, HeadersLike, Role, SpdyConnection
from tests.support import Standalone

__all__ = ["SpdyClient"]

E = TypeVar("E")
WAIT = 10.0


class SpdyClient:
    """The client end of a SPDY session against the test server."""

    def __init__(
        self,
        read: Callable[[], Awaitable[bytes]],
        write: Callable[[bytes], Awaitable[None]],
        close: Callable[[], Awaitable[None]],
    ) -> None:
        self.conn = SpdyConnection(Role.CLIENT)
        self.events: deque[Event] = deque()
        self.eof = False
        self.head = b""
        """The HTTP answer to the upgrade (direct connections only)."""
        self._read, self._write, self._close = read, write, close

    @classmethod
    async def upgrade(
        cls, subres: Standalone, path: str, *protocols: str, split: bool = False
    ) -> SpdyClient:
        """POST an `Upgrade: SPDY/3.1` request to `path`; fails unless the answer is 101."""
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", subres.server.port, ssl=subres.client_ssl, server_hostname="localhost"
        )
        offers = "".join(f"X-Stream-Protocol-Version: {p}\r\n" for p in protocols)
        writer.write(
            (
                f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n"
                f"Authorization: Bearer {subres.token}\r\n"
                f"Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\n{offers}\r\n"
            ).encode()
        )
        async with asyncio.timeout(WAIT):
            head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101 "), head

        async def write(data: bytes) -> None:
            writer.write(data)
            await writer.drain()

        async def close() -> None:
            writer.close()

        client = cls(lambda: reader.read(65536), write, close)
        client.head = head
        return client

    @classmethod
    async def tunnel(cls, http: aiohttp.ClientSession, subres: Standalone, path: str) -> SpdyClient:
        """A WebSocket with `SPDY/3.1+portforward.k8s.io`, sending one byte per message."""
        ws = await http.ws_connect(
            f"wss://127.0.0.1:{subres.server.port}{path}",
            ssl=subres.client_ssl,
            headers=subres.auth,
            protocols=("SPDY/3.1+portforward.k8s.io",),
            compress=0,
        )
        assert ws.protocol == "SPDY/3.1+portforward.k8s.io"

        async def read() -> bytes:
            msg = await ws.receive()
            return msg.data if msg.type is aiohttp.WSMsgType.BINARY else b""

        async def write(data: bytes) -> None:
            # Message boundaries must mean nothing: cut frames into single bytes.
            for i in range(len(data)):
                await ws.send_bytes(data[i : i + 1])

        async def close() -> None:
            await ws.close()

        return cls(read, write, close)

    async def flush(self) -> None:
        """Send what the codec queued."""
        if data := self.conn.data_to_send():
            await self._write(data)

    async def open(self, headers: HeadersLike, *, fin: bool = False) -> int:
        """Open a stream and return its id."""
        stream_id = self.conn.open_stream(headers, fin=fin)
        await self.flush()
        return stream_id

    async def send(self, stream_id: int, data: bytes, *, fin: bool = False) -> None:
        """Send data on a stream."""
        self.conn.send_data(stream_id, data, fin=fin)
        await self.flush()

    async def next_event(self) -> Event | None:
        """The next event, or None at EOF."""
        async with asyncio.timeout(WAIT):
            while not self.events and not self.eof:
                data = await self._read()
                if not data:
                    self.eof = True
                    break
                self.events.extend(self.conn.receive_data(data))
                await self.flush()
        return self.events.popleft() if self.events else None

    async def expect(self, kind: type[E], **fields: object) -> E:
        """Skip events until one of `kind` with `fields`; fail at EOF."""
        while True:
            event = await self.next_event()
            assert event is not None, f"EOF while waiting for {kind.__name__} {fields}"
            if isinstance(event, kind) and all(getattr(event, k) == v for k, v in fields.items()):
                return event

    async def until_eof(self) -> list[Event]:
        """Every event until the server hangs up."""
        seen = []
        while (event := await self.next_event()) is not None:
            seen.append(event)
        return seen

    async def close(self) -> None:
        """Hang up."""
        await self._close()
