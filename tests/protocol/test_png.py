"""The streaming PNG encoder against the PNG layout, a real decoder, and bad input."""

from __future__ import annotations

import io
import random
import struct
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

from subres.protocol import png


def chunks_of(data: bytes) -> list[tuple[bytes, bytes]]:
    """The chunks of a PNG file, each CRC checked."""
    assert data[:8] == png.SIGNATURE
    chunks = []
    pos = 8
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert crc == zlib.crc32(kind + body)
        chunks.append((kind, body))
        pos += 12 + length
    return chunks


def test_png_layout() -> None:
    image = bytes(range(2 * 3 * 3))
    data = b"".join(png.stream(width=3, height=2, row=lambda y: image[y * 9 : y * 9 + 9]))
    chunks = chunks_of(data)
    assert [k for k, _ in chunks] == [b"IHDR", b"IDAT", b"IEND"]
    assert chunks[0][1] == struct.pack(">IIBBBBB", 3, 2, 8, 2, 0, 0, 0)
    assert zlib.decompress(chunks[1][1]) == b"\x00" + image[:9] + b"\x00" + image[9:]
    with pytest.raises(ValueError, match="row 0 has 2 bytes, not 9"):
        list(png.stream(width=3, height=1, row=lambda y: b"ab"))
    with pytest.raises(ValueError, match="cannot be 0x1"):
        list(png.stream(width=0, height=1, row=lambda y: b""))


def test_png_streams_in_pieces_that_decode_to_the_image() -> None:
    # Incompressible rows: the IDAT data is split into many chunks as it is made.
    width, height = 600, 400
    image = random.Random(7).randbytes(width * height * 3)
    pieces = list(
        png.stream(width=width, height=height, row=lambda y: image[y * 1800 : (y + 1) * 1800])
    )
    assert len(pieces) > 5 and max(len(p) for p in pieces) < png.CHUNK + 4096
    data = b"".join(pieces)
    kinds = [k for k, _ in chunks_of(data)]
    assert kinds[0] == b"IHDR" and kinds[-1] == b"IEND" and kinds.count(b"IDAT") > 5
    with Image.open(io.BytesIO(data)) as decoded:
        assert decoded.size == (width, height) and decoded.tobytes() == image


@given(
    width=st.integers(min_value=1, max_value=40),
    height=st.integers(min_value=1, max_value=40),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
)
def test_any_image_decodes_to_its_pixels(width: int, height: int, seed: int) -> None:
    image = random.Random(seed).randbytes(width * height * 3)
    size = width * 3
    data = b"".join(
        png.stream(width=width, height=height, row=lambda y: image[y * size : (y + 1) * size])
    )
    with Image.open(io.BytesIO(data)) as decoded:
        assert decoded.mode == "RGB" and decoded.size == (width, height)
        assert decoded.tobytes() == image
