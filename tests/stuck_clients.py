"""Clients that open a connection to subres and never get anywhere, until the server hangs up.

Shared by the connection tests and the connection benchmark. Each opener
returns a `Stuck` connection once it is in the state it means to hold;
`Stuck.closed_by_server` returns once the server has closed it (EOF or
reset) and fails if the server sends something instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import ssl
from dataclasses import dataclass

__all__ = [
    "Stuck",
    "closed_by_server",
    "idle_tls",
    "keepalive_after_one_request",
    "no_handshake",
    "slowloris",
    "tls_connection",
]


async def tls_connection(
    port: int, tls: ssl.SSLContext
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A TLS connection to 127.0.0.1:`port` (the certificate names localhost)."""
    return await asyncio.open_connection("127.0.0.1", port, ssl=tls, server_hostname="localhost")


async def closed_by_server(reader: asyncio.StreamReader) -> None:
    """Return once the server closes (EOF or reset); fail if it sends anything instead."""
    with contextlib.suppress(ConnectionError, ssl.SSLError):
        assert await reader.read(65536) == b""


@dataclass
class Stuck:
    """One stuck client connection."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    trickling: asyncio.Task[None] | None = None

    async def closed_by_server(self) -> None:
        """Wait for the server to hang up, then let go of everything."""
        try:
            await closed_by_server(self.reader)
        finally:
            if self.trickling is not None:
                self.trickling.cancel()
                await asyncio.wait([self.trickling])
            self.writer.close()


async def idle_tls(port: int, tls: ssl.SSLContext) -> Stuck:
    """Finishes the TLS handshake, then says nothing."""
    return Stuck(*await tls_connection(port, tls))


async def slowloris(port: int, tls: ssl.SSLContext, *, every: float) -> Stuck:
    """Starts a request and adds a header line every `every` seconds, never ending the head."""
    reader, writer = await tls_connection(port, tls)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n")

    async def trickle() -> None:
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            while not writer.is_closing():
                writer.write(b"X-Slow: 1\r\n")
                await writer.drain()
                await asyncio.sleep(every)  # the attack: a line now and then

    return Stuck(reader, writer, asyncio.create_task(trickle()))


async def keepalive_after_one_request(port: int, tls: ssl.SSLContext) -> Stuck:
    """One complete request and its answer, then an idle keep-alive connection."""
    reader, writer = await tls_connection(port, tls)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    assert b"Connection: close" not in head
    length = re.search(rb"Content-Length: (\d+)", head)
    assert length is not None, head
    assert await reader.readexactly(int(length.group(1))) == b"ok"
    return Stuck(reader, writer)


async def no_handshake(port: int) -> Stuck:
    """Opens TCP and never starts TLS."""
    return Stuck(*await asyncio.open_connection("127.0.0.1", port))
