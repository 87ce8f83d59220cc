"""The WebSocket frame codec: RFC 6455's examples, round trips in any chunking, hostile input."""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from subres.protocol.websocket import (
    MAX_LEFTOVER,
    CloseCode,
    DataReceived,
    Event,
    FrameDecoder,
    Opcode,
    ProtocolError,
    close_payload,
    decode_text,
    frame_header,
    parse_close,
)
from tests.wsframes import Reader, client_frame

MASK = bytes.fromhex("37fa213d")


def read(*chunks: bytes, max_message: int = 1 << 20) -> Reader:
    reader = Reader(FrameDecoder(max_message=max_message))
    for chunk in chunks:
        reader.receive(chunk)
    return reader


def test_the_rfc_examples_of_masked_frames() -> None:
    # RFC 6455 5.7: a masked text "Hello" and a masked pong with the same body.
    hello = bytes.fromhex("818537fa213d7f9f4d5158")
    pong = bytes.fromhex("8a8537fa213d7f9f4d5158")
    reader = read(hello + pong)
    assert reader.messages == [(Opcode.TEXT, b"Hello")]
    assert reader.controls == [(Opcode.PONG, b"Hello")]


def test_the_rfc_examples_of_server_headers() -> None:
    assert frame_header(Opcode.TEXT, 5) == bytes.fromhex("8105")
    assert frame_header(Opcode.PING, 5) == bytes.fromhex("8905")
    assert frame_header(Opcode.BINARY, 256) == bytes.fromhex("827e0100")
    assert frame_header(Opcode.BINARY, 65536) == bytes.fromhex("827f0000000000010000")
    assert frame_header(Opcode.TEXT, 3, fin=False) == bytes.fromhex("0103")


def test_a_fragmented_message_with_a_ping_inside() -> None:
    # RFC 6455 5.4: control frames may come between the fragments of a message.
    reader = read(
        client_frame(Opcode.TEXT, b"Hel", fin=False, mask=MASK)
        + client_frame(Opcode.PING, b"?", mask=MASK)
        + client_frame(Opcode.CONTINUATION, b"lo", mask=MASK)
    )
    assert reader.messages == [(Opcode.TEXT, b"Hello")]
    assert reader.controls == [(Opcode.PING, b"?")]


def test_a_payload_arrives_in_pieces_as_it_comes() -> None:
    decoder = FrameDecoder(max_message=1 << 20)
    frame = client_frame(Opcode.BINARY, bytes(range(200)) * 2, mask=MASK)
    events, consumed = decoder.feed(frame[:100])
    [piece] = data(events)
    assert consumed == 100
    assert (piece.start, piece.stop, piece.first, piece.last) == (8, 100, True, False)
    events, consumed = decoder.feed(frame[100:])
    [piece] = data(events)
    assert consumed == len(frame) - 100
    # The second piece starts 92 bytes into the payload: the mask is turned by 92 % 4 = 0.
    assert (piece.mask, piece.first, piece.last) == (MASK, False, True)
    decoder.feed(frame[:9])
    events, _ = decoder.feed(b"\x00")  # 1 byte into a new payload after 1 byte
    assert events[0].mask == MASK[1:] + MASK[:1]


def data(events: list[Event]) -> list[DataReceived]:
    """`events`, each checked to be a data piece."""
    assert all(isinstance(event, DataReceived) for event in events)
    return [event for event in events if isinstance(event, DataReceived)]


def test_an_incomplete_header_is_left_for_the_next_call() -> None:
    frame = client_frame(Opcode.BINARY, b"x" * 70000, mask=MASK)
    decoder = FrameDecoder(max_message=1 << 20)
    for cut in range(14):
        events, consumed = decoder.feed(frame[:cut])
        assert (events, consumed) == ([], 0)
    assert decoder.feed(frame[:14]) == ([], 14)  # the header alone: no piece yet
    events, consumed = decoder.feed(frame[14:20])
    [piece] = data(events)
    assert consumed == 6 and (piece.start, piece.stop, piece.first) == (0, 6, True)


def test_empty_messages_and_empty_fragments() -> None:
    reader = read(
        client_frame(Opcode.BINARY, b"")
        + client_frame(Opcode.BINARY, b"", fin=False)
        + client_frame(Opcode.CONTINUATION, b"ab", fin=False)
        + client_frame(Opcode.CONTINUATION, b"")
    )
    assert reader.messages == [(Opcode.BINARY, b""), (Opcode.BINARY, b"ab")]


def test_after_a_close_frame_everything_is_consumed_and_ignored() -> None:
    decoder = FrameDecoder(max_message=100)
    data = client_frame(Opcode.CLOSE, b"\x03\xe8") + b"\xff garbage"
    events, consumed = decoder.feed(data)
    assert consumed == len(data) and len(events) == 1 and decoder.closed
    assert decoder.feed(b"\x00\x01") == ([], 2)


messages = st.lists(
    st.tuples(
        st.sampled_from([Opcode.TEXT, Opcode.BINARY]),
        st.binary(max_size=300),
        st.lists(st.integers(0, 300), max_size=3),  # where the message is cut into fragments
        st.lists(st.binary(max_size=125), max_size=2),  # pings sent between them
    ),
    max_size=8,
)


def encode(plan: list[tuple[Opcode, bytes, list[int], list[bytes]]]) -> tuple[bytes, list[bytes]]:
    """The frames of `plan`'s messages, fragmented and with pings between, and the pings sent."""
    out, sent = b"", []
    for opcode, payload, cuts, pings in plan:
        bounds = sorted({min(c, len(payload)) for c in cuts} | {0, len(payload)})
        pieces = [payload[a:b] for a, b in itertools.pairwise(bounds)] or [b""]
        for index, piece in enumerate(pieces):
            op = opcode if index == 0 else Opcode.CONTINUATION
            out += client_frame(op, piece, fin=index == len(pieces) - 1)
            if index < len(pings):
                out += client_frame(Opcode.PING, pings[index])
                sent.append(pings[index])
    return out, sent


@given(plan=messages, cuts=st.lists(st.integers(1, 4000), max_size=30))
@settings(max_examples=300, deadline=None)
def test_round_trip_in_any_chunking(
    plan: list[tuple[Opcode, bytes, list[int], list[bytes]]], cuts: list[int]
) -> None:
    data, pings = encode(plan)
    bounds = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    reader = read(*(data[a:b] for a, b in itertools.pairwise(bounds)))
    assert reader.messages == [(opcode, payload) for opcode, payload, _, _ in plan]
    assert reader.controls == [(Opcode.PING, p) for p in pings]


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (client_frame(0x3, b"x"), CloseCode.PROTOCOL_ERROR),  # reserved opcode
        (client_frame(0xB, b""), CloseCode.PROTOCOL_ERROR),
        (client_frame(Opcode.BINARY, b"x", rsv=0b100), CloseCode.PROTOCOL_ERROR),
        (client_frame(Opcode.BINARY, b"x", masked=False), CloseCode.PROTOCOL_ERROR),
        (client_frame(Opcode.PING, b"p" * 126), CloseCode.PROTOCOL_ERROR),
        (client_frame(Opcode.PING, b"", fin=False), CloseCode.PROTOCOL_ERROR),
        (client_frame(Opcode.CONTINUATION, b"x"), CloseCode.PROTOCOL_ERROR),
        (
            client_frame(Opcode.TEXT, b"a", fin=False) + client_frame(Opcode.BINARY, b"b"),
            CloseCode.PROTOCOL_ERROR,
        ),
        (b"\x82\xff" + b"\xff" * 8 + b"mask", CloseCode.PROTOCOL_ERROR),  # length over 2^63
        (client_frame(Opcode.BINARY, b"", length=1 << 62), CloseCode.MESSAGE_TOO_BIG),
        (client_frame(Opcode.BINARY, b"x" * 101), CloseCode.MESSAGE_TOO_BIG),
        (
            client_frame(Opcode.BINARY, b"x" * 60, fin=False)
            + client_frame(Opcode.CONTINUATION, b"x" * 41),
            CloseCode.MESSAGE_TOO_BIG,
        ),
    ],
    ids=[
        "reserved-data-opcode",
        "reserved-control-opcode",
        "rsv",
        "unmasked",
        "long-ping",
        "fragmented-ping",
        "lone-continuation",
        "message-inside-message",
        "length-over-2^63",
        "huge-length",
        "too-big",
        "too-big-in-fragments",
    ],
)
def test_hostile_frames_are_refused_with_the_right_code(data: bytes, code: CloseCode) -> None:
    with pytest.raises(ProtocolError) as caught:
        read(data, max_message=100)
    assert caught.value.code == code


@given(data=st.binary(max_size=2000), cut=st.integers(0, 2000))
@settings(max_examples=500, deadline=None)
def test_any_bytes_decode_or_are_refused_and_never_leave_more_than_a_frame_head(
    data: bytes, cut: int
) -> None:
    # Reader asserts every span lies in what was consumed and leftovers stay small.
    try:
        read(data[:cut], data[cut:], max_message=1000)
    except ProtocolError as exc:
        assert exc.code in (CloseCode.PROTOCOL_ERROR, CloseCode.MESSAGE_TOO_BIG)
    assert MAX_LEFTOVER == 139


def test_close_payloads() -> None:
    assert parse_close(b"") == (CloseCode.NO_STATUS, "")
    assert parse_close(struct.pack("!H", 4001) + "ça".encode()) == (4001, "ça")
    assert close_payload(1000, "") == b"\x03\xe8"
    # The reason is cut to 123 bytes at a character boundary.
    payload = close_payload(1011, "é" * 100)
    assert len(payload) == 2 + 122 and payload[2:].decode() == "é" * 61
    for bad in (b"\x03", struct.pack("!H", 1005), struct.pack("!H", 999), b"\x0b\xb7"):
        with pytest.raises(ProtocolError) as caught:
            parse_close(bad)
        assert caught.value.code == CloseCode.PROTOCOL_ERROR
    with pytest.raises(ProtocolError) as caught:
        parse_close(b"\x03\xe8\xff")
    assert caught.value.code == CloseCode.INVALID_DATA


def test_text_must_be_utf8() -> None:
    assert decode_text("żółw".encode()) == "żółw"
    with pytest.raises(ProtocolError) as caught:
        decode_text(b"\xc3\x28")
    assert caught.value.code == CloseCode.INVALID_DATA
