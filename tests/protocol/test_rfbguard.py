"""The viewer guard on fixed RFB bytes: a shared ClientInit, a view-only viewer's input dropped."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from subres.protocol.rfbguard import (
    HEAD_LIMIT,
    MAX_CUT_TEXT,
    MAX_EARLY,
    ViewerGuard,
    ViewerRefused,
)

V38 = b"RFB 003.008\n"
V33 = b"RFB 003.003\n"
SET_PIXEL_FORMAT = b"\x00\x00\x00\x00" + bytes(16)
SET_ENCODINGS = b"\x02\x00\x00\x02" + struct.pack(">ii", 0, -223)
UPDATE_REQUEST = b"\x03\x01" + struct.pack(">HHHH", 0, 0, 640, 400)
KEY = b"\x04\x01\x00\x00" + struct.pack(">I", 0x61)
POINTER = b"\x05\x01" + struct.pack(">HH", 10, 20)
CUT_TEXT = b"\x06\x00\x00\x00" + struct.pack(">i", 5) + b"hello"
EXTENDED_CUT_TEXT = b"\x06\x00\x00\x00" + struct.pack(">i", -8) + b"\x00" * 8
CONTINUOUS = b"\x96\x01" + struct.pack(">HHHH", 0, 0, 640, 400)
FENCE = b"\xf8\x00\x00\x00" + struct.pack(">IB", 0x80000000, 3) + b"abc"
DESKTOP_SIZE = b"\xfb\x00" + struct.pack(">HHBx", 800, 600, 1) + bytes(16)
XVP_REBOOT = b"\xfa\x00\x01\x03"
GII = b"\xfd\x80" + struct.pack(">H", 4) + b"\x00\x00\x00\x00"
QEMU_KEY = b"\xff\x00" + struct.pack(">HII", 1, 0x61, 30)
QEMU_AUDIO_ENABLE = b"\xff\x01\x00\x00"
QEMU_AUDIO_FORMAT = b"\xff\x01\x00\x02" + b"\x03\x02" + struct.pack(">I", 44100)

HANDSHAKE_38 = V38 + b"\x01" + b"\x00"
"""Version, security type None, ClientInit asking for an exclusive session."""
PASSED = [SET_PIXEL_FORMAT, SET_ENCODINGS, UPDATE_REQUEST, CONTINUOUS, FENCE]
PASSED += [QEMU_AUDIO_ENABLE, QEMU_AUDIO_FORMAT]
DROPPED = [KEY, POINTER, CUT_TEXT, EXTENDED_CUT_TEXT, DESKTOP_SIZE, XVP_REBOOT, GII, QEMU_KEY]


def run(guard: ViewerGuard, chunks: list[bytes]) -> bytes:
    return b"".join(guard.from_client(chunk) for chunk in chunks)


def test_every_viewer_asks_for_a_shared_session_then_an_interactive_one_passes_as_is() -> None:
    guard = ViewerGuard(view_only=False)
    stream = HANDSHAKE_38 + KEY + POINTER + DESKTOP_SIZE
    assert run(guard, [stream]) == V38 + b"\x01\x01" + KEY + POINTER + DESKTOP_SIZE
    assert guard.transparent


def test_a_view_only_viewer_keeps_what_only_reads_and_loses_what_acts() -> None:
    guard = ViewerGuard(view_only=True)
    messages = [m for pair in zip(PASSED + PASSED, DROPPED, strict=False) for m in pair]
    out = run(guard, [HANDSHAKE_38, *messages])
    assert out == V38 + b"\x01\x01" + b"".join(m for m in messages if m in PASSED)


@given(st.lists(st.integers(min_value=1, max_value=40), max_size=60))
def test_any_chunking_gives_the_same_bytes(cuts: list[int]) -> None:
    stream = HANDSHAKE_38 + b"".join(PASSED + DROPPED)
    chunks, at = [], 0
    for size in cuts:
        chunks.append(stream[at : at + size])
        at += size
    chunks.append(stream[at:])
    expected = run(ViewerGuard(view_only=True), [stream])
    assert run(ViewerGuard(view_only=True), chunks) == expected
    assert expected == V38 + b"\x01\x01" + b"".join(PASSED)


def test_vnc_authentication_passes_its_response() -> None:
    guard = ViewerGuard(view_only=True)
    response = bytes(range(16))
    out = run(guard, [V38, b"\x02", response, b"\x00", KEY, UPDATE_REQUEST])
    assert out == V38 + b"\x02" + response + b"\x01" + UPDATE_REQUEST


def test_rfb_33_reads_the_security_type_the_server_chose() -> None:
    guard = ViewerGuard(view_only=True)
    assert guard.wants_server
    guard.from_server(V33 + struct.pack(">I", 2) + bytes(16))  # type, then the challenge
    assert not guard.wants_server
    response = b"r" * 16
    assert run(guard, [V33, response + b"\x00" + POINTER + UPDATE_REQUEST]) == (
        V33 + response + b"\x01" + UPDATE_REQUEST
    )


def test_a_view_only_viewer_is_refused_what_cannot_be_checked() -> None:
    with pytest.raises(ViewerRefused, match="security type 19"):
        run(ViewerGuard(view_only=True), [V38 + b"\x13"])
    with pytest.raises(ViewerRefused, match="unknown RFB message type 99"):
        run(ViewerGuard(view_only=True), [HANDSHAKE_38 + b"\x63"])
    with pytest.raises(ViewerRefused, match="unknown QEMU RFB message 7"):
        run(ViewerGuard(view_only=True), [HANDSHAKE_38 + b"\xff\x07"])
    huge = b"\x06\x00\x00\x00" + struct.pack(">i", 1 << 24)
    with pytest.raises(ViewerRefused, match="cut text of 16777216 bytes"):
        run(ViewerGuard(view_only=True), [HANDSHAKE_38 + huge])
    with pytest.raises(ViewerRefused, match="not an RFB protocol version"):
        run(ViewerGuard(view_only=True), [b"GET / HTTP/1.1\r\n"])


def test_an_interactive_viewer_it_cannot_read_passes_untouched() -> None:
    tls = ViewerGuard(view_only=False)
    assert run(tls, [V38 + b"\x13", b"\x00\x02 anything"]) == V38 + b"\x13\x00\x02 anything"
    odd = ViewerGuard(view_only=False)
    assert run(odd, [b"one", b"two"]) == b"onetwo"


@pytest.mark.parametrize("view_only", [True, False])
def test_a_viewer_pushing_bytes_at_a_silent_rfb_33_server_is_refused_not_buffered(
    view_only: bool,
) -> None:
    # The guest sent its version but not yet its security type: 128 MiB from the viewer.
    guard = ViewerGuard(view_only=view_only)
    guard.from_server(V33)
    assert guard.from_client(V33) == V33
    chunk = bytes(1 << 20)
    with pytest.raises(ViewerRefused, match="before the VNC server chose a security type"):
        for _ in range(128):
            assert guard.from_client(chunk) == b""
            assert guard.buffered <= MAX_EARLY
    assert guard.buffered <= MAX_EARLY + len(chunk)


def test_an_rfb_33_viewer_that_waits_for_the_server_loses_nothing() -> None:
    guard = ViewerGuard(view_only=False)
    guard.from_server(V33)
    early = b"\x00" + UPDATE_REQUEST  # a viewer that guessed None and sent ahead
    assert run(guard, [V33, early]) == V33
    guard.from_server(struct.pack(">I", 1))
    assert guard.from_client(KEY) == b"\x01" + UPDATE_REQUEST + KEY


def test_large_messages_pass_or_drop_as_they_arrive_and_are_never_held_whole() -> None:
    count = 0xFFFF
    encodings = b"\x02\x00" + struct.pack(">H", count) + bytes(4 * count)
    cut = b"\x06\x00\x00\x00" + struct.pack(">i", MAX_CUT_TEXT) + b"x" * MAX_CUT_TEXT
    stream = encodings + cut + UPDATE_REQUEST
    guard = ViewerGuard(view_only=True)
    out = run(guard, [HANDSHAKE_38])
    for at in range(0, len(stream), 4096):
        out += guard.from_client(stream[at : at + 4096])
        assert guard.buffered <= HEAD_LIMIT
    assert out == V38 + b"\x01\x01" + encodings + UPDATE_REQUEST
