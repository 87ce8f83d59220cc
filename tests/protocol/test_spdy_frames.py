"""SPDY/3.1 frames against bytes written by hand from the draft's layouts."""

from __future__ import annotations

import struct
import zlib

import pytest

from subres.protocol.spdy.dictionary import SPDY3_DICTIONARY, SPDY3_DICTIONARY_ADLER32
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
from subres.protocol.spdy.headers import HeaderDecoder, HeaderEncoder
from subres.protocol.spdy.limits import Limits
from subres.protocol.spdy.parser import FrameParser
from subres.protocol.spdy.status import GoAwayStatus, RstStatus

# streamtype: data, port: 80, laid out by hand: count, then length-prefixed fields.
BLOCK = bytes.fromhex(
    "00000002"
    "0000000a" + b"streamtype".hex() + "00000004" + b"data".hex() + "00000004"
    "" + b"port".hex() + "00000002" + b"80".hex()
)
HEADERS = (("streamtype", "data"), ("port", "80"))

# Every frame without a header block, as the draft lays it out.
FIXED: list[tuple[str, Frame]] = [
    # DATA: stream id 1, flags FIN, length 5.
    ("00000001 01 000005 68656c6c6f", DataFrame(1, b"hello", fin=True)),
    ("7fffffff 00 000000", DataFrame(0x7FFFFFFF)),
    # RST_STREAM: 0x8003, type 3, flags 0, length 8, stream 5, CANCEL.
    ("80030003 00 000008 00000005 00000005", RstStreamFrame(5, RstStatus.CANCEL)),
    # SETTINGS: one entry, flags PERSIST_VALUE, id MAX_CONCURRENT_STREAMS, 1000.
    ("80030004 00 00000c 00000001 01000004 000003e8", SettingsFrame((Setting(4, 1000, 1),))),
    ("80030004 01 000004 00000000", SettingsFrame((), clear=True)),
    ("80030006 00 000004 00000007", PingFrame(7)),
    ("80030006 00 000004 fffffffe", PingFrame(0xFFFFFFFE)),
    ("80030007 00 000008 00000003 00000001", GoAwayFrame(3, GoAwayStatus.PROTOCOL_ERROR)),
    ("80030009 00 000008 00000000 00010000", WindowUpdateFrame(0, 65536)),
    ("80030009 00 000008 00000003 00000010", WindowUpdateFrame(3, 16)),
]


def parse_all(data: bytes, decoder: HeaderDecoder | None = None) -> list[Frame]:
    parser = FrameParser(decoder or HeaderDecoder(max_block_size=1 << 16, max_count=100), Limits())
    parser.feed(data)
    frames: list[Frame] = []
    for _ in range(len(data)):
        frame = parser.next_frame()
        if frame is None:
            break
        frames.append(frame)
    assert parser.buffered == 0
    return frames


def compress(block: bytes) -> bytes:
    """Compress as a peer would, with zlib directly rather than our encoder."""
    stream = zlib.compressobj(9, zlib.DEFLATED, 15, 9, zdict=SPDY3_DICTIONARY)
    return stream.compress(block) + stream.flush(zlib.Z_SYNC_FLUSH)


def test_dictionary_is_the_spdy3_dictionary() -> None:
    assert len(SPDY3_DICTIONARY) == 1423
    assert zlib.adler32(SPDY3_DICTIONARY) == SPDY3_DICTIONARY_ADLER32 == 0xE3C6A7C2
    assert SPDY3_DICTIONARY.startswith(b"\x00\x00\x00\x07options\x00\x00\x00\x04head")
    assert SPDY3_DICTIONARY.endswith(b"charset=iso-8859-1,utf-,*,enq=0.")


@pytest.mark.parametrize(("wire", "frame"), FIXED)
def test_fixed_frame_serializes_to_its_bytes(wire: str, frame: Frame) -> None:
    assert serialize(frame, HeaderEncoder()) == bytes.fromhex(wire)


@pytest.mark.parametrize(("wire", "frame"), FIXED)
def test_fixed_bytes_parse_to_their_frame(wire: str, frame: Frame) -> None:
    assert parse_all(bytes.fromhex(wire)) == [frame]


def test_syn_stream_layout_and_compressed_block() -> None:
    frame = SynStreamFrame(1, HEADERS, priority=3, fin=True)
    wire = serialize(frame, HeaderEncoder())
    first, flags_length = struct.unpack(">II", wire[:8])
    assert first == 0x80030001
    assert flags_length >> 24 == 0x01
    assert flags_length & 0xFFFFFF == len(wire) - 8
    # stream id 1, associated 0, priority 3 in the top 3 bits, slot 0
    assert wire[8:18] == bytes.fromhex("00000001 00000000 60 00")
    block = wire[18:]
    # RFC 1950 header: deflate/32K window, level 9, FDICT, then the dictionary id.
    assert block[:6] == bytes.fromhex("78f9 e3c6a7c2")
    assert block.endswith(b"\x00\x00\xff\xff")  # the sync flush
    inflater = zlib.decompressobj(zdict=SPDY3_DICTIONARY)
    assert inflater.decompress(block) == BLOCK


def test_syn_stream_from_hand_built_bytes() -> None:
    block = compress(BLOCK)
    body = bytes.fromhex("00000003 00000001 e0 07") + block
    wire = bytes.fromhex("80030001 03") + len(body).to_bytes(3, "big") + body
    assert parse_all(wire) == [
        SynStreamFrame(
            3, HEADERS, associated_id=1, priority=7, slot=7, fin=True, unidirectional=True
        )
    ]


def test_syn_reply_and_headers_share_one_zlib_stream() -> None:
    stream = zlib.compressobj(9, zlib.DEFLATED, 15, 9, zdict=SPDY3_DICTIONARY)
    empty = bytes.fromhex("00000000")
    first = stream.compress(empty) + stream.flush(zlib.Z_SYNC_FLUSH)
    second = stream.compress(BLOCK) + stream.flush(zlib.Z_SYNC_FLUSH)
    reply = bytes.fromhex("80030002 00") + (4 + len(first)).to_bytes(3, "big")
    headers = bytes.fromhex("80030008 01") + (4 + len(second)).to_bytes(3, "big")
    wire = reply + bytes.fromhex("00000001") + first + headers + bytes.fromhex("00000001") + second
    assert parse_all(wire) == [SynReplyFrame(1), HeadersFrame(1, HEADERS, fin=True)]


def test_syn_reply_serializes_its_layout() -> None:
    wire = serialize(SynReplyFrame(9, (), fin=True), HeaderEncoder())
    assert wire[:5] == bytes.fromhex("80030002 01")
    assert int.from_bytes(wire[5:8], "big") == len(wire) - 8
    assert wire[8:12] == bytes.fromhex("00000009")
    assert zlib.decompressobj(zdict=SPDY3_DICTIONARY).decompress(wire[12:]) == b"\0\0\0\0"


def test_multiple_values_travel_nul_joined() -> None:
    wire = serialize(HeadersFrame(1, (("a", "x"), ("a", "y"), ("b", ""))), HeaderEncoder())
    block = zlib.decompressobj(zdict=SPDY3_DICTIONARY).decompress(wire[12:])
    assert block == bytes.fromhex("00000002 00000001 61 00000003 78 00 79 00000001 62 00000000")
    assert parse_all(wire) == [HeadersFrame(1, (("a", "x"), ("a", "y"), ("b", "")))]


@pytest.mark.parametrize(
    "make",
    [
        lambda: DataFrame(0),
        lambda: SynStreamFrame(0, ()),
        lambda: SynStreamFrame(1, (), priority=8),
        lambda: RstStreamFrame(1, 0),
        lambda: PingFrame(0),
        lambda: GoAwayFrame(1 << 31),
        lambda: Setting(1 << 24, 0),
        lambda: DataFrame(1 << 31),
    ],
)
def test_frames_the_go_peer_rejects_cannot_be_built(make: object) -> None:
    assert callable(make)
    with pytest.raises(ValueError):
        make()
