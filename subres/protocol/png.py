"""PNG encoding of 8-bit RGB images (the screenshot's body), with the standard library.

Owns the PNG byte layout: signature, IHDR, one zlib-compressed IDAT whose rows
use filter type 0, IEND; each chunk with its CRC-32 (PNG spec, ISO/IEC 15948).
"""

from __future__ import annotations

import struct
import zlib

__all__ = ["encode_rgb"]

SIGNATURE = b"\x89PNG\r\n\x1a\n"
_COLOUR_TYPE_RGB = 2
_BIT_DEPTH = 8


def encode_rgb(*, width: int, height: int, rgb: bytes, level: int = 6) -> bytes:
    """A PNG file of `width` x `height` pixels given as packed R, G, B bytes, row by row."""
    row = width * 3
    if width <= 0 or height <= 0 or len(rgb) != row * height:
        raise ValueError(f"{len(rgb)} bytes are not a {width}x{height} RGB image")
    # Each scanline starts with its filter type; 0 (None) keeps encoding cheap.
    scanlines = b"".join(b"\x00" + rgb[y * row : (y + 1) * row] for y in range(height))
    header = struct.pack(">IIBBBBB", width, height, _BIT_DEPTH, _COLOUR_TYPE_RGB, 0, 0, 0)
    return b"".join(
        (
            SIGNATURE,
            _chunk(b"IHDR", header),
            _chunk(b"IDAT", zlib.compress(scanlines, level)),
            _chunk(b"IEND", b""),
        )
    )


def _chunk(kind: bytes, data: bytes) -> bytes:
    crc = zlib.crc32(kind + data)
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)
