"""The first packet of the usbredir protocol, for tests that talk to a USB slot through subres.

subres relays usbredir without reading it; the tests speak its first packet
to prove that the far end is a usbredir peer: a `hello` (type 0) whose body
is a version string of 64 bytes, NUL-padded, and the sender's capability
words, after a header of three little-endian u32s (type, length, id), as the
usbredir protocol (0.7) describes it. QEMU's usb-redir device sends one with
the version `qemu usb-redir guest X.Y.Z` as soon as a client connects.
`FakeSlot` stands in for that device where no QEMU runs.
"""

from __future__ import annotations

import asyncio
import struct

__all__ = ["HELLO", "FakeSlot", "hello", "parse_hello", "read_hello"]

HELLO = 0
"""usb_redir_hello's packet type."""
HEADER = struct.Struct("<III")
VERSION_SIZE = 64


def hello(version: str, caps: int = 0) -> bytes:
    """A hello packet announcing `version` and one word of capabilities."""
    body = version.encode().ljust(VERSION_SIZE, b"\0") + struct.pack("<I", caps)
    return HEADER.pack(HELLO, len(body), 0) + body


def parse_hello(data: bytes) -> str | None:
    """The version of the hello `data` starts with; None while it holds less than one."""
    if len(data) < HEADER.size:
        return None
    kind, length, _ = HEADER.unpack_from(data)
    assert kind == HELLO and VERSION_SIZE < length <= 1024, (kind, length)
    if len(data) < HEADER.size + length:
        return None
    return data[HEADER.size : HEADER.size + VERSION_SIZE].rstrip(b"\0").decode()


async def read_hello(reader: asyncio.StreamReader) -> str:
    """The version string of the hello `reader` gets first (anything else fails the test)."""
    kind, length, _ = HEADER.unpack(await reader.readexactly(HEADER.size))
    assert kind == HELLO and VERSION_SIZE < length <= 1024, (kind, length)
    body = await reader.readexactly(length)
    return body[:VERSION_SIZE].rstrip(b"\0").decode()


class FakeSlot:
    """A usb-redir device as QEMU's answers a connection: its hello first, then an echo."""

    VERSION = "subres-test usb-redir guest"

    def __init__(self, slot: int = 0) -> None:
        self.version = f"{self.VERSION} slot {slot}"
        self.hellos: list[str] = []
        """The versions clients announced, in order."""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(hello(self.version))
        await writer.drain()
        self.hellos.append(await read_hello(reader))
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
