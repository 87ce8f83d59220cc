"""The agent relay's frames: fixed bytes, any chunking, hostile input."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from subres.protocol import relay


def fed(decoder: relay.FrameDecoder, wire: bytes, cuts: list[int]) -> list[relay.Event]:
    """The events of `wire` fed to `decoder` in pieces cut at `cuts` (modulo its length)."""
    events: list[relay.Event] = []
    start = 0
    for cut in [*sorted(c % (len(wire) + 1) for c in cuts), len(wire)]:
        events += decoder.feed(wire[start:cut])
        start = max(start, cut)
    return events


def test_frames_are_a_type_byte_a_length_and_the_payload() -> None:
    assert relay.data(b"hi") == b"\x00\x00\x00\x00\x02hi"
    assert relay.eof() == b"\x01\x00\x00\x00\x00"
    assert relay.error("gone") == b"\x02\x00\x00\x00\x04gone"
    assert relay.error("é" * 2000) == b"\x02\x00\x00\x04\x00" + ("é" * 512).encode()


def test_decoder_yields_events_in_order() -> None:
    wire = relay.data(b"abc") + relay.data(b"") + relay.eof() + relay.error("boom")
    assert relay.FrameDecoder().feed(wire) == [
        relay.DataReceived(b"abc"),
        relay.DataReceived(b""),
        relay.EofReceived(),
        relay.ErrorReceived("boom"),
    ]


@given(
    payloads=st.lists(st.binary(max_size=300), max_size=8),
    cuts=st.lists(st.integers(min_value=0, max_value=3000), max_size=10),
)
def test_any_chunking_gives_the_same_frames(payloads: list[bytes], cuts: list[int]) -> None:
    wire = b"".join(relay.data(p) for p in payloads) + relay.eof()
    decoder = relay.FrameDecoder()
    events = fed(decoder, wire, cuts)
    assert events == [relay.DataReceived(p) for p in payloads] + [relay.EofReceived()]


@pytest.mark.parametrize(
    ("wire", "message"),
    [
        (b"\x07\x00\x00\x00\x00", "unknown relay frame type 7"),
        (b"\x01\x00\x00\x00\x01x", "EOF frame with a payload"),
        (b"\x00\xff\xff\xff\xff", "exceeds"),
    ],
)
def test_hostile_frames_are_refused(wire: bytes, message: str) -> None:
    with pytest.raises(relay.FrameError, match=message):
        relay.FrameDecoder().feed(wire)


def test_a_huge_length_is_refused_before_its_payload_arrives() -> None:
    decoder = relay.FrameDecoder()
    with pytest.raises(relay.FrameError):
        decoder.feed((relay.MAX_FRAME + 1).to_bytes(5, "big"))


@given(
    payloads=st.lists(st.binary(min_size=1, max_size=3000), max_size=6),
    cuts=st.lists(st.integers(min_value=0, max_value=20000), max_size=12),
)
def test_partial_mode_hands_out_payload_bytes_as_they_come(
    payloads: list[bytes], cuts: list[int]
) -> None:
    wire = b"".join(relay.data(p) for p in payloads) + relay.error("x")
    decoder = relay.FrameDecoder(partial=True)
    events = fed(decoder, wire, cuts)
    data = [e for e in events if isinstance(e, relay.DataReceived)]
    assert b"".join(e.data for e in data) == b"".join(payloads)
    assert events[-1] == relay.ErrorReceived("x")


def test_partial_mode_passes_a_payload_only_chunk_uncopied() -> None:
    decoder = relay.FrameDecoder(partial=True)
    first = relay.data(b"abcdefghij")[:-7]  # the header and three bytes of the payload
    assert decoder.feed(first) == [relay.DataReceived(b"abc")]
    middle = b"defg"
    [event] = decoder.feed(middle)
    assert event.data is middle  # type: ignore[union-attr]
    assert decoder.feed(b"hij" + relay.eof()) == [relay.DataReceived(b"hij"), relay.EofReceived()]


def test_peer_frames_carry_a_window_size_and_a_close_code_with_its_reason() -> None:
    assert relay.resize(120, 40) == b"\x03\x00\x00\x00\x04\x00\x78\x00\x28"
    assert relay.close(4001, "taken over") == b"\x04\x00\x00\x00\x0c\x0f\xa1taken over"
    assert relay.resize(-1, 70000) == b"\x03\x00\x00\x00\x04\x00\x00\xff\xff"
    assert len(relay.close(1000, "é" * 200)) == 5 + 2 + 123
    wire = relay.resize(80, 24) + relay.data(b"x") + relay.close(1001, "moved")
    assert relay.FrameDecoder(peer=True).feed(wire) == [
        relay.ResizeReceived(80, 24),
        relay.DataReceived(b"x"),
        relay.CloseReceived(1001, "moved"),
    ]


def test_an_exit_frame_carries_a_signed_32_bit_status_before_the_eof() -> None:
    assert relay.exit_status(3) == b"\x06\x00\x00\x00\x04\x00\x00\x00\x03"
    assert relay.exit_status(-1) == b"\x06\x00\x00\x00\x04\xff\xff\xff\xff"
    assert relay.exit_status(1 << 40) == b"\x06\x00\x00\x00\x04\x7f\xff\xff\xff"
    wire = relay.data(b"bye") + relay.exit_status(130) + relay.eof()
    assert relay.FrameDecoder(partial=True, peer=True).feed(wire) == [
        relay.DataReceived(b"bye"),
        relay.ExitReceived(130),
        relay.EofReceived(),
    ]


@given(
    width=st.integers(0, 0xFFFF),
    height=st.integers(0, 0xFFFF),
    code=st.integers(0, 0xFFFF),
    reason=st.text(max_size=40),
    status=st.integers(-(1 << 31), (1 << 31) - 1),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=6),
)
def test_peer_frames_round_trip(
    *, width: int, height: int, code: int, reason: str, status: int, cuts: list[int]
) -> None:
    wire = relay.resize(width, height) + relay.exit_status(status) + relay.close(code, reason)
    events = fed(relay.FrameDecoder(partial=True, peer=True), wire, cuts)
    assert events[:2] == [relay.ResizeReceived(width, height), relay.ExitReceived(status)]
    assert isinstance(events[2], relay.CloseReceived) and events[2].code == code
    assert reason.encode()[:123].decode(errors="replace") == events[2].reason


@pytest.mark.parametrize(
    ("wire", "message"),
    [
        (b"\x03\x00\x00\x00\x03abc", "RESIZE frame of 3 bytes"),
        (b"\x04\x00\x00\x00\x01x", "CLOSE frame without a code"),
        (b"\x06\x00\x00\x00\x03abc", "EXIT frame of 3 bytes"),
        (b"\x06\x00\x00\x00\x05abcde", "EXIT frame of 5 bytes"),
        (b"\x06\x00\x00\x00\x00", "EXIT frame of 0 bytes"),
    ],
)
def test_hostile_peer_frames_are_refused(wire: bytes, message: str) -> None:
    with pytest.raises(relay.FrameError, match=message):
        relay.FrameDecoder(peer=True).feed(wire)


@pytest.mark.parametrize(
    "frame", [relay.resize(80, 24), relay.close(4001, "taken over"), relay.exit_status(3)]
)
def test_an_agent_relay_refuses_peer_frames(frame: bytes) -> None:
    with pytest.raises(relay.FrameError, match="unknown relay frame type"):
        relay.FrameDecoder().feed(frame)


def test_a_heartbeat_is_a_frame_of_its_own_type_without_a_payload() -> None:
    assert relay.heartbeat() == b"\x05\x00\x00\x00\x00"


@pytest.mark.parametrize("partial", [False, True])
def test_heartbeats_are_consumed_and_yield_nothing(partial: bool) -> None:
    wire = relay.heartbeat() + relay.data(b"ab") + relay.heartbeat() * 3 + relay.eof()
    assert relay.FrameDecoder(partial=partial).feed(wire) == [
        relay.DataReceived(b"ab"),
        relay.EofReceived(),
    ]
    assert relay.FrameDecoder(peer=True).feed(relay.heartbeat()) == []


@given(
    payloads=st.lists(st.binary(max_size=300), max_size=6),
    beats=st.lists(st.integers(min_value=0, max_value=6), max_size=6),
    cuts=st.lists(st.integers(min_value=0, max_value=3000), max_size=10),
)
def test_heartbeats_anywhere_between_frames_change_no_event(
    payloads: list[bytes], beats: list[int], cuts: list[int]
) -> None:
    frames = [relay.data(p) for p in payloads] + [relay.eof()]
    for where in beats:
        frames.insert(where % (len(frames) + 1), relay.heartbeat())
    wire = b"".join(frames)
    decoder = relay.FrameDecoder(partial=True)
    events = fed(decoder, wire, cuts)
    data = b"".join(e.data for e in events if isinstance(e, relay.DataReceived))
    assert data == b"".join(payloads)
    assert events[-1] == relay.EofReceived()


def test_a_heartbeat_with_a_payload_is_refused_before_the_payload_arrives() -> None:
    with pytest.raises(relay.FrameError, match="HEARTBEAT frame with a payload"):
        relay.FrameDecoder(partial=True).feed(b"\x05\x00\x00\x00\x01")


@pytest.mark.parametrize(
    ("header", "interval"),
    [
        ("2", 2.0),
        ("0.5", 0.5),
        (" 60 ", 60.0),
        (None, None),
        ("", None),
        ("soon", None),
        ("0.01", None),
        ("61", None),
        ("nan", None),
        ("inf", None),
        ("-2", None),
    ],
)
def test_the_heartbeat_header_names_a_bounded_interval(
    header: str | None, interval: float | None
) -> None:
    assert relay.heartbeat_interval(header) == interval
