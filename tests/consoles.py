"""Support for the shared-console tests: a console that keeps what reached it, channel reads.

`Console` is an echo backend (a `tests.support.Backend` handler) that keeps
every byte it received and can print on every connection, as a machine's
serial console would; `stdout_until` and `closed` read a `v5.channel.k8s.io`
client's side. Every wait is bounded.
"""

from __future__ import annotations

import asyncio

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

__all__ = ["WAIT", "Console", "closed", "stdout_until"]

WAIT = 10.0
"""Seconds any wait here may take."""


class Console:
    """An echo console: keeps what it received, prints what `say` gives it, half-closes back."""

    def __init__(self) -> None:
        self.received = bytearray()
        self.arrived = asyncio.Condition()
        self.ended = asyncio.Event()
        """Some connection's client ended its input (EOF)."""
        self.writers: list[asyncio.StreamWriter] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A `Backend` handler."""
        self.writers.append(writer)
        try:
            while data := await reader.read(65536):
                async with self.arrived:
                    self.received += data
                    self.arrived.notify_all()
                writer.write(data)
                await writer.drain()
            self.ended.set()
            if writer.can_write_eof():
                writer.write_eof()
        finally:
            self.writers.remove(writer)

    async def say(self, text: bytes) -> None:
        """Print `text` on every connection."""
        for writer in self.writers:
            writer.write(text)
            await writer.drain()

    async def wait_received(self, size: int) -> None:
        """Wait until `size` bytes have arrived."""
        async with asyncio.timeout(WAIT), self.arrived:
            await self.arrived.wait_for(lambda: len(self.received) >= size)


async def stdout_until(ws: ClientConnection, text: bytes) -> bytes:
    """Everything on a v5 client's stdout up to and including `text`."""
    got = bytearray()
    async with asyncio.timeout(WAIT):
        while text not in got:
            message = await ws.recv()
            assert isinstance(message, bytes)
            if message[:1] == b"\x01":
                got += message[1:]
    return bytes(got)


async def closed(ws: ClientConnection) -> tuple[int | None, str | None]:
    """Read until the server closes `ws`; its close code and reason."""
    try:
        async with asyncio.timeout(WAIT):
            while True:
                await ws.recv()
    except ConnectionClosed:
        pass
    return ws.close_code, ws.close_reason
