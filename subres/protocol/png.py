"""PNG encoding of 8-bit RGB images (the screenshot's body), with the standard library.

Owns the PNG byte layout: signature, IHDR, IDAT chunks holding one zlib
stream whose rows use filter type 0, IEND; each chunk with its CRC-32 (PNG
spec, ISO/IEC 15948). `stream` takes the rows one at a time and yields the
file in pieces, so neither the filtered image nor the compressed one is ever
held whole: memory beyond the caller's rows is zlib's window and one chunk.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Iterator

__all__ = ["SIGNATURE", "stream"]

SIGNATURE = b"\x89PNG\r\n\x1a\n"
_COLOUR_TYPE_RGB = 2
_BIT_DEPTH = 8
_FILTER_NONE = b"\x00"
CHUNK = 1 << 16
"""Compressed bytes gathered before an IDAT chunk is yielded."""


def stream(
    *, width: int, height: int, row: Callable[[int], bytes | memoryview], level: int = 6
) -> Iterator[bytes]:
    """A PNG file of `width` x `height` RGB pixels in pieces; `row(y)` gives row y's bytes."""
    if not (0 < width < 1 << 31 and 0 < height < 1 << 31):
        raise ValueError(f"a PNG cannot be {width}x{height}")
    size = width * 3
    header = struct.pack(">IIBBBBB", width, height, _BIT_DEPTH, _COLOUR_TYPE_RGB, 0, 0, 0)
    yield SIGNATURE + _chunk(b"IHDR", header)
    compressor = zlib.compressobj(level)
    pending = bytearray()
    for y in range(height):
        data = row(y)
        if len(data) != size:
            raise ValueError(f"row {y} has {len(data)} bytes, not {size}")
        # Each scanline starts with its filter type; 0 (None) keeps encoding cheap.
        pending += compressor.compress(_FILTER_NONE)
        pending += compressor.compress(data)
        if len(pending) >= CHUNK:
            yield _chunk(b"IDAT", pending)
            pending.clear()
    pending += compressor.flush()
    yield _chunk(b"IDAT", pending) + _chunk(b"IEND", b"")


def _chunk(kind: bytes, data: bytes | bytearray) -> bytes:
    crc = zlib.crc32(data, zlib.crc32(kind))
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)
