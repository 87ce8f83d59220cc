"""The incremental frame parser: arbitrary chunking, limits and hostile lengths."""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from subres.protocol.spdy.errors import ProtocolError, StreamError
from subres.protocol.spdy.frames import (
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    Setting,
    SettingsFrame,
    SynReplyFrame,
    SynStreamFrame,
    WindowUpdateFrame,
    serialize,
)
from subres.protocol.spdy.headers import HeaderDecoder, HeaderEncoder, Headers
from subres.protocol.spdy.limits import Limits
from subres.protocol.spdy.parser import FrameParser
from subres.protocol.spdy.status import RstStatus

IDS = st.integers(1, 0x7FFFFFFF)
U32 = st.integers(0, 0xFFFFFFFF)
NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=12)
HEADERS: st.SearchStrategy[Headers] = st.dictionaries(
    NAMES, st.text(alphabet=st.characters(codec="ascii", exclude_characters="\0"), max_size=20)
).map(lambda d: tuple(d.items()))

FRAMES: st.SearchStrategy[Frame] = st.one_of(
    st.builds(DataFrame, IDS, st.binary(max_size=300), st.booleans()),
    st.builds(
        SynStreamFrame,
        IDS,
        HEADERS,
        associated_id=st.integers(0, 0x7FFFFFFF),
        priority=st.integers(0, 7),
        slot=st.integers(0, 255),
        fin=st.booleans(),
        unidirectional=st.booleans(),
    ),
    st.builds(SynReplyFrame, IDS, HEADERS, st.booleans()),
    st.builds(HeadersFrame, IDS, HEADERS, st.booleans()),
    st.builds(RstStreamFrame, IDS, st.integers(1, 0xFFFFFFFF)),
    st.builds(
        SettingsFrame,
        st.lists(
            st.builds(Setting, st.integers(0, 0xFFFFFF), U32, st.integers(0, 255)), max_size=5
        ).map(tuple),
        st.booleans(),
    ),
    st.builds(PingFrame, st.integers(1, 0xFFFFFFFF)),
    st.builds(GoAwayFrame, st.integers(0, 0x7FFFFFFF), U32),
    st.builds(WindowUpdateFrame, st.integers(0, 0x7FFFFFFF), st.integers(0, 0x7FFFFFFF)),
)


def new_parser(**limits: int) -> FrameParser:
    decoder = HeaderDecoder(max_block_size=1 << 16, max_count=100)
    return FrameParser(decoder, Limits(**limits))


def drain(parser: FrameParser) -> list[Frame]:
    frames: list[Frame] = []
    for _ in range(100_000):
        frame = parser.next_frame()
        if frame is None:
            return frames
        frames.append(frame)
    raise AssertionError("parser did not stop")


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


def control(frame_type: int, payload: bytes, *, flags: int = 0, version: int = 3) -> bytes:
    return struct.pack(">HHI", 0x8000 | version, frame_type, flags << 24 | len(payload)) + payload


@given(st.lists(FRAMES, max_size=12), st.lists(st.integers(0, 10_000), max_size=30))
def test_frames_survive_any_chunking(frames: list[Frame], cuts: list[int]) -> None:
    encoder = HeaderEncoder()
    wire = b"".join(serialize(frame, encoder) for frame in frames)
    parser, parsed = new_parser(), []
    for chunk in chunked(wire, cuts):
        parser.feed(chunk)
        parsed += drain(parser)
    assert joined_pieces(parsed, frames) == frames
    assert parser.buffered == 0


def joined_pieces(parsed: list[Frame], expected: list[Frame]) -> list[Frame]:
    """`parsed` with each DATA frame that came out in pieces (one per chunk it spans) whole.

    Pieces are views of the chunks, never copies; only the last carries FIN.
    """
    whole: list[Frame] = []
    pending = iter(parsed)
    for frame in expected:
        if not isinstance(frame, DataFrame):
            whole.append(next(pending))
            continue
        data: list[DataFrame] = []
        while not data or sum(len(p.data) for p in data) < len(frame.data):
            piece = next(pending)
            assert isinstance(piece, DataFrame) and piece.stream_id == frame.stream_id
            data.append(piece)
        assert not any(p.fin for p in data[:-1])
        whole.append(DataFrame(frame.stream_id, b"".join(p.data for p in data), data[-1].fin))
    assert next(pending, None) is None
    return whole


def test_a_data_payload_is_a_view_of_its_chunk_and_an_empty_one_ends_a_chunk() -> None:
    wire = serialize(DataFrame(3, b"abc"), HeaderEncoder())
    parser = new_parser()
    parser.feed(wire)
    [frame] = drain(parser)
    assert isinstance(frame, DataFrame) and isinstance(frame.data, memoryview)
    assert frame.data.obj is wire
    parser.feed(serialize(DataFrame(3, b"", fin=True), HeaderEncoder()))
    assert drain(parser) == [DataFrame(3, b"", fin=True)]


@given(st.integers(1, 5000), st.booleans(), st.lists(st.integers(0, 6000), max_size=20))
def test_long_data_frames_arrive_in_pieces(length: int, fin: bool, cuts: list[int]) -> None:
    payload = bytes(range(256)) * (length // 256) + bytes(length % 256)
    wire = serialize(DataFrame(5, payload, fin), HeaderEncoder())
    parser, pieces = new_parser(max_buffered_data=100), []
    for chunk in chunked(wire, cuts):
        parser.feed(chunk)
        pieces += drain(parser)
        assert parser.buffered <= 100 + 8
    assert all(isinstance(p, DataFrame) and p.stream_id == 5 for p in pieces)
    data_pieces = [p for p in pieces if isinstance(p, DataFrame)]
    assert b"".join(p.data for p in data_pieces) == payload
    assert [p.fin for p in data_pieces] == [False] * (len(data_pieces) - 1) + [fin]


def test_sixteen_mebibyte_data_frame_is_never_buffered_whole() -> None:
    parser = new_parser()
    parser.feed(struct.pack(">II", 3, 0x01FFFFFF))
    received = 0
    for _ in range(255):
        parser.feed(bytes(65536))
        for piece in drain(parser):
            assert isinstance(piece, DataFrame)
            received += len(piece.data)
        assert parser.buffered <= 65536
    assert received == 0xFFFFFF - 0xFFFF
    parser.feed(bytes(0xFFFF) + serialize(PingFrame(1), HeaderEncoder()))
    assert drain(parser) == [DataFrame(3, bytes(0xFFFF), fin=True), PingFrame(1)]
    assert parser.buffered == 0


def test_truncated_frames_wait_for_more() -> None:
    wire = serialize(RstStreamFrame(1, 5), HeaderEncoder())
    parser = new_parser()
    for i in range(len(wire) - 1):
        parser.feed(wire[i : i + 1])
        assert parser.next_frame() is None
    parser.feed(wire[-1:])
    assert drain(parser) == [RstStreamFrame(1, 5)]


def test_control_frame_over_the_limit_fails_before_its_payload() -> None:
    parser = new_parser(max_control_frame_length=1024)
    parser.feed(control(4, b"")[:5] + (1025).to_bytes(3, "big"))
    with pytest.raises(ProtocolError, match="over the limit"):
        parser.next_frame()
    parser.feed(b"more")
    with pytest.raises(ProtocolError):
        parser.next_frame()
    assert parser.buffered == 0


def test_data_frame_over_the_limit_resets_its_stream_and_goes_on() -> None:
    parser = new_parser(max_data_frame_length=10)
    parser.feed(struct.pack(">II", 7, 11) + bytes(11) + serialize(PingFrame(2), HeaderEncoder()))
    with pytest.raises(StreamError) as caught:
        parser.next_frame()
    assert (caught.value.stream_id, caught.value.status) == (7, RstStatus.FRAME_TOO_LARGE)
    assert drain(parser) == [PingFrame(2)]


def test_unknown_control_types_are_skipped_unbuffered() -> None:
    parser = new_parser(max_control_frame_length=16)
    noop = control(5, b"")
    huge_unknown = control(0xFFFF, b"")[:5] + b"\xff\xff\xff"
    parser.feed(noop + huge_unknown)
    assert drain(parser) == []
    for _ in range(255):
        parser.feed(bytes(65536))
        assert drain(parser) == []
        assert parser.buffered == 0
    parser.feed(bytes(65535) + serialize(PingFrame(9), HeaderEncoder()))
    assert drain(parser) == [PingFrame(9)]


@pytest.mark.parametrize(
    ("wire", "message"),
    [
        (control(1, bytes(9)), "below 10"),
        (control(2, bytes(3)), "below 4"),
        (control(8, b""), "below 4"),
        (control(3, bytes(7)), "expected 8"),
        (control(3, struct.pack(">II", 1, 0)), "status 0"),
        (control(3, struct.pack(">II", 0, 5)), "stream 0"),
        (control(4, b""), "below 4"),
        (control(4, struct.pack(">I", 2) + bytes(8)), "2 entries"),
        (control(4, struct.pack(">I", 0xFFFFFFFF)), "entries"),
        (control(6, bytes(3)), "expected 4"),
        (control(6, bytes(4)), "id 0"),
        (control(7, bytes(4)), "expected 8"),
        (control(9, bytes(12)), "expected 8"),
        (control(6, bytes(4), version=2), "version 2"),
        (struct.pack(">II", 0, 0), "stream 0"),
        (control(1, bytes(10) + b"junk"), "stream 0"),
        (control(1, struct.pack(">IIH", 1, 0, 0) + b"junk"), "decompress"),
    ],
)
def test_malformed_frames_end_the_session(wire: bytes, message: str) -> None:
    parser = new_parser()
    parser.feed(wire)
    with pytest.raises(ProtocolError, match=message):
        parser.next_frame()


@given(st.binary(max_size=2000), st.lists(st.integers(0, 3000), max_size=10))
def test_garbage_raises_only_codec_errors(garbage: bytes, cuts: list[int]) -> None:
    parser = new_parser(max_control_frame_length=4096, max_buffered_data=512)
    for chunk in chunked(garbage, cuts):
        parser.feed(chunk)
        for _ in range(len(garbage) + 1):
            try:
                if parser.next_frame() is None:
                    break
            except StreamError:
                continue
            except ProtocolError:
                return
        assert parser.buffered <= 4096 + 8
