"""The demo display's RFB server against a raw client: versions, pixel formats, updates, input."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from subres.demo.vnc import Display, VncServer, encode_pixels
from subres.protocol.rfb import PixelFormat

BIG_ENDIAN_32 = PixelFormat(32, 24, True, True, 255, 255, 255, 16, 8, 0)
RGB_565 = PixelFormat(16, 16, False, True, 31, 63, 31, 11, 5, 0)


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.text = "00:00:00"

    def __call__(self) -> str:
        return self.text


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def server(tmp_path: Path, clock: Clock) -> AsyncIterator[VncServer]:
    vnc = VncServer(tmp_path / "vnc.sock", display=Display(clock=clock))
    await vnc.start()
    yield vnc
    await vnc.stop()


async def connect(
    server: VncServer, version: bytes = b"RFB 003.008\n"
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
    """Handshake as `version`; the reader, writer and the ServerInit's first 4 bytes."""
    reader, writer = await asyncio.open_unix_connection(str(server.path))
    async with asyncio.timeout(5):
        assert await reader.readexactly(12) == b"RFB 003.008\n"
        writer.write(version)
        if version == b"RFB 003.003\n":
            assert await reader.readexactly(4) == b"\x00\x00\x00\x01"
        else:
            assert await reader.readexactly(2) == b"\x01\x01"
            writer.write(b"\x01")
            if version == b"RFB 003.008\n":
                assert await reader.readexactly(4) == b"\x00\x00\x00\x00"
        writer.write(b"\x00")  # ClientInit, exclusive: the demo keeps everyone anyway
        init = await reader.readexactly(24)
        await reader.readexactly(struct.unpack(">I", init[20:])[0])
    return reader, writer, init[:4]


def request(x: int, y: int, w: int, h: int, *, incremental: bool = False) -> bytes:
    return struct.pack(">BBHHHH", 3, incremental, x, y, w, h)


async def read_update(
    reader: asyncio.StreamReader, bytes_per_pixel: int
) -> tuple[tuple[int, ...], bytes]:
    async with asyncio.timeout(5):
        head = await reader.readexactly(4)
        assert head[0] == 0 and struct.unpack(">H", head[2:])[0] == 1
        x, y, w, h, encoding = struct.unpack(">HHHHi", await reader.readexactly(12))
        assert encoding == 0
        return (x, y, w, h), await reader.readexactly(w * h * bytes_per_pixel)


@pytest.mark.parametrize("version", [b"RFB 003.008\n", b"RFB 003.007\n", b"RFB 003.003\n"])
async def test_every_version_gets_the_native_format(server: VncServer, version: bytes) -> None:
    reader, writer, size = await connect(server, version)
    d = server.display
    assert size == struct.pack(">HH", d.width, d.height)
    writer.write(request(0, 0, d.width, d.height))
    area, data = await read_update(reader, 4)
    assert area == (0, 0, d.width, d.height)
    assert data == encode_pixels(
        bytes(d.rgb), PixelFormat(32, 24, False, True, 255, 255, 255, 16, 8, 0)
    )
    assert data[:4] == b"\xff\x00\x00\x00"  # top left: blue, little-endian B, G, R, pad
    writer.close()


@pytest.mark.parametrize(
    ("fmt", "expected"),
    [(BIG_ENDIAN_32, b"\x00\x00\x00\xff"), (RGB_565, struct.pack("<H", 0x001F))],
)
async def test_set_pixel_format(server: VncServer, fmt: PixelFormat, expected: bytes) -> None:
    reader, writer, _ = await connect(server)
    writer.write(b"\x00\x00\x00\x00" + fmt.pack())
    writer.write(request(0, 0, 1, 1))
    area, data = await read_update(reader, fmt.bits_per_pixel // 8)
    assert (area, data) == ((0, 0, 1, 1), expected)
    writer.close()


async def test_incremental_updates_wait_for_the_clock(server: VncServer, clock: Clock) -> None:
    reader, writer, _ = await connect(server)
    d = server.display
    # Keys, pointer moves, encodings and cut text are accepted and change nothing.
    writer.write(b"\x04\x01\x00\x00\x00\x00\x00\x61" + b"\x05\x01\x00\x10\x00\x10")
    writer.write(b"\x02\x00\x00\x01\x00\x00\x00\x00" + b"\x06\x00\x00\x00\x00\x00\x00\x02hi")
    writer.write(request(0, 0, d.width, d.height))
    await read_update(reader, 4)
    writer.write(request(0, 0, d.width, d.height, incremental=True))
    await writer.drain()
    clock.text = "00:00:01"
    d.tick()
    area, data = await read_update(reader, 4)
    assert area == d.clock_area
    assert len(data) == d.clock_area[2] * d.clock_area[3] * 4
    writer.close()


async def test_unknown_messages_end_only_that_viewer(server: VncServer) -> None:
    reader, writer, _ = await connect(server)
    writer.write(b"\x63")
    async with asyncio.timeout(5):
        assert await reader.read() == b""
    writer.close()
    reader, writer, _ = await connect(server)
    writer.write(request(0, 0, 1, 1))
    assert (await read_update(reader, 4))[0] == (0, 0, 1, 1)
    writer.close()
