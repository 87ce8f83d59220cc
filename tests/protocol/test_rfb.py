"""The RFB capture codec against bytes written from RFC 6143, any chunking, and hostile servers."""

from __future__ import annotations

import itertools
import re
import struct
import tracemalloc

import pytest
from hypothesis import given
from hypothesis import strategies as st

from subres.protocol import png, rfb
from subres.protocol.rfb import (
    CAPTURE_FORMAT,
    FramebufferCaptured,
    Limits,
    Phase,
    RfbError,
    ScreenshotClient,
    ServerInitialised,
)

NATIVE = rfb.PixelFormat(32, 24, False, True, 255, 255, 255, 16, 8, 0).pack()
SET_PIXEL_FORMAT = b"\x00\x00\x00\x00" + CAPTURE_FORMAT.pack()
SET_ENCODINGS_RAW = b"\x02\x00\x00\x01\x00\x00\x00\x00"


def server_init(width: int, height: int, name: bytes = b"vm") -> bytes:
    return struct.pack(">HH", width, height) + NATIVE + struct.pack(">I", len(name)) + name


def request(width: int, height: int) -> bytes:
    return struct.pack(">BBHHHH", 3, 0, 0, 0, width, height)


def rect(area: tuple[int, int, int, int], encoding: int, data: bytes = b"") -> bytes:
    return struct.pack(">HHHHi", *area, encoding) + data


def update(*rects: bytes, count: int | None = None) -> bytes:
    return struct.pack(">BxH", 0, len(rects) if count is None else count) + b"".join(rects)


def pixels(w: int, h: int, seed: int = 0) -> bytes:
    return bytes((seed + i * 7) % 256 for i in range(w * h * 4))


def rgb(wire: bytes) -> bytearray:
    """`CAPTURE_FORMAT` wire pixels (B, G, R, padding) as packed R, G, B."""
    out = bytearray()
    for i in range(0, len(wire), 4):
        out += bytes((wire[i + 2], wire[i + 1], wire[i]))
    return out


HANDSHAKE_38 = b"RFB 003.008\n" + b"\x02\x02\x01" + b"\x00\x00\x00\x00"


def test_rfb_38_handshake_and_capture_byte_for_byte() -> None:
    client = ScreenshotClient()
    assert client.receive_data(b"RFB 003.008\n") == []
    assert client.data_to_send() == b"RFB 003.008\n"
    client.receive_data(b"\x02\x02\x01")  # two types: VNC auth, None
    assert client.data_to_send() == b"\x01"
    assert client.phase is Phase.SECURITY_RESULT
    client.receive_data(b"\x00\x00\x00\x00")
    assert client.data_to_send() == b"\x01"  # ClientInit, shared
    events = client.receive_data(server_init(2, 2, b"desk"))
    assert events == [ServerInitialised(2, 2, "desk")]
    assert client.data_to_send() == SET_PIXEL_FORMAT + SET_ENCODINGS_RAW + request(2, 2)
    body = pixels(2, 2)
    events = client.receive_data(update(rect((0, 0, 2, 2), 0, body)))
    assert events == [FramebufferCaptured(2, 2, rgb(body))]
    assert isinstance(events[0], FramebufferCaptured)
    assert bytes(events[0].row(1)) == rgb(body)[6:]
    assert client.receive_data(b"\x02") == []  # done: later bytes are ignored


def test_rfb_37_none_has_no_security_result() -> None:
    client = ScreenshotClient()
    client.receive_data(b"RFB 003.007\n\x01\x01" + server_init(1, 1))
    out = client.data_to_send()
    assert out.startswith(b"RFB 003.007\n\x01\x01" + SET_PIXEL_FORMAT)
    assert client.phase is Phase.UPDATE


@pytest.mark.parametrize("version", [b"RFB 003.003\n", b"RFB 003.005\n"])
def test_rfb_33_server_decides_the_security_type(version: bytes) -> None:
    client = ScreenshotClient()
    client.receive_data(version + b"\x00\x00\x00\x01" + server_init(1, 1))
    assert client.data_to_send().startswith(b"RFB 003.003\n\x01" + SET_PIXEL_FORMAT)


@pytest.mark.parametrize("version", [b"RFB 003.889\n", b"RFB 004.001\n"])
def test_newer_servers_get_38(version: bytes) -> None:
    client = ScreenshotClient()
    client.receive_data(version)
    assert client.data_to_send() == b"RFB 003.008\n"


def test_rectangles_assemble_the_framebuffer_and_pseudo_encodings_are_skipped() -> None:
    client = ScreenshotClient()
    client.receive_data(HANDSHAKE_38 + server_init(4, 2))
    client.data_to_send()
    left, right = pixels(2, 2, 1), pixels(2, 2, 99)
    cursor = rect((0, 0, 2, 2), rfb.CURSOR, b"\xaa" * (2 * 2 * 4 + 1 * 2))
    events = client.receive_data(
        b"\x02"  # Bell
        + b"\x03\x00\x00\x00\x00\x00\x00\x02hi"  # ServerCutText
        + b"\x01\x00\x00\x00\x00\x01"
        + b"\x00" * 6  # SetColourMapEntries
        + update(
            cursor,
            rect((0, 0, 0, 0), rfb.POINTER_POS),
            rect((2, 0, 2, 2), 0, right),
            rect((0, 0, 2, 2), 0, left),
            rect((0, 0, 0, 0), rfb.LAST_RECT),
            count=0xFFFF,
        )
    )
    expected = left[:8] + right[:8] + left[8:] + right[8:]
    assert events == [FramebufferCaptured(4, 2, rgb(expected))]


def test_desktop_resize_asks_again_for_the_new_size() -> None:
    client = ScreenshotClient()
    client.receive_data(HANDSHAKE_38 + server_init(4, 4))
    client.data_to_send()
    assert client.receive_data(update(rect((0, 0, 2, 1), rfb.DESKTOP_SIZE))) == []
    assert client.data_to_send() == request(2, 1)
    extended = rect((0, 0, 1, 1), rfb.EXTENDED_DESKTOP_SIZE, b"\x01\x00\x00\x00" + b"\x00" * 16)
    assert client.receive_data(update(extended)) == []
    assert client.data_to_send() == request(1, 1)
    events = client.receive_data(update(rect((0, 0, 1, 1), 0, b"\x01\x02\x03\x00")))
    assert events == [FramebufferCaptured(1, 1, bytearray(b"\x03\x02\x01"))]


def conversation(width: int, height: int) -> tuple[bytes, bytes]:
    """A whole server side and the framebuffer it carries."""
    body = pixels(width, height, width)
    top, bottom = body[: width * 4], body[width * 4 :]
    data = (
        HANDSHAKE_38
        + server_init(width, height)
        + update(rect((0, 0, width, 1), 0, top), rect((0, 1, width, height - 1), 0, bottom))
    )
    return data, body


@given(cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=40))
def test_any_chunking_gives_the_same_framebuffer(cuts: list[int]) -> None:
    data, body = conversation(7, 5)
    client = ScreenshotClient()
    events: list[rfb.Event] = []
    bounds = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    for start, end in itertools.pairwise(bounds):
        events += client.receive_data(data[start:end])
    assert events[-1] == FramebufferCaptured(7, 5, rgb(body))


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"HTTP/1.1 400 Bad\r\n", "not an RFB server"),
        (b"RFB 002.000\n", "older than 3.3"),
        (b"RFB 003.008\n\x01\x02", "requires authentication (offers VNC Authentication (2))"),
        (b"RFB 003.003\n\x00\x00\x00\x02", "requires authentication"),
        (b"RFB 003.008\n\x00\x00\x00\x00\x07go away", "refused the connection: go away"),
        (b"RFB 003.003\n\x00\x00\x00\x00\x00\x00\x00\x04busy", "refused the connection: busy"),
        (HANDSHAKE_38[:-4] + b"\x00\x00\x00\x01\x00\x00\x00\x02no", "failed (result 1): no"),
        (b"RFB 003.008\n\x00\xff\xff\xff\xff", "reason is 4294967295 bytes"),
        (HANDSHAKE_38 + server_init(0, 10), "framebuffer is empty"),
        (HANDSHAKE_38 + server_init(65535, 65535), "over 16777216 pixels"),
        (HANDSHAKE_38 + server_init(1, 1)[:20] + b"\x7f\xff\xff\xff", "name is"),
        (HANDSHAKE_38 + server_init(2, 2) + b"\x09", "unknown server message type 9"),
        (HANDSHAKE_38 + server_init(2, 2) + update(rect((1, 1, 2, 1), 0)), "outside the 2x2"),
        (HANDSHAKE_38 + server_init(2, 2) + update(rect((0, 0, 1, 1), 5)), "encoding 5"),
        (HANDSHAKE_38 + server_init(2, 2) + b"\x03\x00\x00\x00\xff\xff\xff\xff", "ServerCutText"),
        (
            HANDSHAKE_38 + server_init(2, 2) + update(rect((0, 0, 0, 0), rfb.DESKTOP_SIZE)),
            "framebuffer is empty",
        ),
    ],
)
def test_hostile_servers_raise_rfb_error(data: bytes, words: str) -> None:
    with pytest.raises(RfbError, match=re.escape(words)):
        ScreenshotClient().receive_data(data)


def test_overlapping_rectangles_are_bounded() -> None:
    client = ScreenshotClient()
    client.receive_data(HANDSHAKE_38 + server_init(2, 2))
    whole = rect((0, 0, 2, 2), 0, pixels(2, 2))
    with pytest.raises(RfbError, match="more than twice"):
        client.receive_data(update(whole, whole, whole))


def test_endless_chatter_and_resizes_are_bounded() -> None:
    client = ScreenshotClient(limits=Limits(max_messages=10))
    client.receive_data(HANDSHAKE_38 + server_init(2, 2))
    with pytest.raises(RfbError, match="after 10 server messages"):
        client.receive_data(b"\x02" * 11)
    client = ScreenshotClient()
    client.receive_data(HANDSHAKE_38 + server_init(2, 2))
    with pytest.raises(RfbError, match="after 4 requests"):
        client.receive_data(update(rect((0, 0, 2, 2), rfb.DESKTOP_SIZE)) * 4)


def test_capture_and_png_hold_one_framebuffer_at_most() -> None:
    """Peak Python memory of capturing and encoding a 2048x2048 screen is its RGB
    framebuffer (12 MiB) plus small change, however the wire bytes arrive."""
    width, height = 2048, 2048
    wire_row = bytes(range(256)) * (width * 4 // 256)
    head = HANDSHAKE_38 + server_init(width, height)
    head += update(rect((0, 0, width, height), 0))
    framebuffer = width * height * 3
    client = ScreenshotClient()
    tracemalloc.start()
    try:
        events = client.receive_data(head)
        for _ in range(height // 16):
            events += client.receive_data(wire_row * 16)  # 128 KiB reads
        [_, shot] = events
        assert isinstance(shot, FramebufferCaptured)
        size = sum(len(p) for p in png.stream(width=width, height=height, row=shot.row))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert size > 0
    assert peak < framebuffer + (2 << 20), f"peak {peak / 2**20:.1f} MiB"
