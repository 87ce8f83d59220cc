"""A `SpdyConnection` fed by a peer that breaks the rules.

The peer here is hand-driven: frames built with our frame classes and its own
header compressor, answers read back with a parser of its own. Every fault must
come out as events and queued RST_STREAM or GOAWAY frames, never as an
exception, and no table or buffer may grow past its limit.
"""

from __future__ import annotations

import struct
import tracemalloc
import zlib

from hypothesis import given, settings
from hypothesis import strategies as st

from subres.protocol.spdy import (
    ConnectionTerminated,
    DataReceived,
    Event,
    GoAwayStatus,
    Limits,
    Role,
    RstStatus,
    SpdyConnection,
    StreamEnded,
    StreamOpened,
    StreamReset,
)
from subres.protocol.spdy.dictionary import SPDY3_DICTIONARY
from subres.protocol.spdy.frames import (
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SynReplyFrame,
    SynStreamFrame,
    WindowUpdateFrame,
    serialize,
)
from subres.protocol.spdy.headers import HeaderDecoder, HeaderEncoder
from subres.protocol.spdy.parser import FrameParser


class Peer:
    """A raw client talking to a server `SpdyConnection`."""

    def __init__(self, **limits: int) -> None:
        self.server = SpdyConnection(Role.SERVER, Limits(**limits))
        self.encoder = HeaderEncoder()
        self.parser = FrameParser(HeaderDecoder(max_block_size=1 << 16, max_count=100), Limits())

    def send(self, *frames: Frame) -> list[Event]:
        return self.server.receive_data(b"".join(serialize(f, self.encoder) for f in frames))

    def send_raw(self, data: bytes) -> list[Event]:
        return self.server.receive_data(data)

    def answers(self) -> list[Frame]:
        self.parser.feed(self.server.data_to_send())
        frames: list[Frame] = []
        for _ in range(100_000):
            frame = self.parser.next_frame()
            if frame is None:
                return frames
            frames.append(frame)
        raise AssertionError("too many frames")


def syn(stream_id: int, fin: bool = False) -> SynStreamFrame:
    return SynStreamFrame(stream_id, (("streamtype", "data"),), fin=fin)


def assert_terminated(peer: Peer, events: list[Event], last_stream_id: int = 0) -> None:
    assert isinstance(events[-1], ConnectionTerminated)
    assert events[-1].status == GoAwayStatus.PROTOCOL_ERROR
    assert peer.answers()[-1] == GoAwayFrame(last_stream_id, GoAwayStatus.PROTOCOL_ERROR)
    assert peer.server.terminated
    assert peer.send(PingFrame(1), syn(99)) == []
    assert peer.answers() == []


def test_syn_stream_on_stream_zero_ends_the_session() -> None:
    peer = Peer()
    raw = serialize(syn(1), peer.encoder)
    events = peer.send_raw(raw[:8] + b"\0\0\0\0" + raw[12:])
    assert_terminated(peer, events)


def test_decreasing_or_repeated_ids_end_the_session() -> None:
    peer = Peer()
    assert [type(e) for e in peer.send(syn(5))] == [StreamOpened]
    assert_terminated(peer, peer.send(syn(3)), last_stream_id=5)
    peer = Peer()
    peer.send(syn(5))
    assert_terminated(peer, peer.send(syn(5)), last_stream_id=5)


def test_wrong_parity_ends_the_session() -> None:
    peer = Peer()
    assert_terminated(peer, peer.send(syn(2)))


def test_data_on_a_never_opened_stream_is_invalid() -> None:
    peer = Peer()
    assert peer.send(DataFrame(7, b"x"), DataFrame(8, b"y")) == []
    assert peer.answers() == [
        RstStreamFrame(7, RstStatus.INVALID_STREAM),
        RstStreamFrame(8, RstStatus.INVALID_STREAM),
    ]


def test_data_on_a_closed_stream_is_answered_once() -> None:
    peer = Peer()
    peer.send(syn(1, fin=True))
    peer.server.reply(1, fin=True)
    assert peer.server.open_stream_ids == ()
    assert peer.send(DataFrame(1, b"late"), DataFrame(1, b"later")) == []
    assert peer.answers()[1:] == [RstStreamFrame(1, RstStatus.STREAM_ALREADY_CLOSED)]


def test_data_after_the_peer_fin_resets_the_stream() -> None:
    peer = Peer()
    peer.send(syn(1))
    events = peer.send(DataFrame(1, b"a", fin=True), DataFrame(1, b"b"))
    assert events == [
        DataReceived(1, b"a", fin=True),
        StreamEnded(1),
        StreamReset(1, RstStatus.STREAM_ALREADY_CLOSED, by_peer=False),
    ]
    assert peer.answers() == [RstStreamFrame(1, RstStatus.STREAM_ALREADY_CLOSED)]
    assert peer.server.open_stream_ids == ()


def test_streams_over_the_cap_are_refused() -> None:
    peer = Peer(max_concurrent_streams=3)
    events = peer.send(*(syn(i) for i in (1, 3, 5, 7, 9)))
    assert [e.stream_id for e in events if isinstance(e, StreamOpened)] == [1, 3, 5]
    assert peer.answers() == [
        RstStreamFrame(7, RstStatus.REFUSED_STREAM),
        RstStreamFrame(9, RstStatus.REFUSED_STREAM),
    ]
    assert peer.send(DataFrame(7, b"dropped")) == []  # a refused stream's data is dropped
    assert peer.answers() == []
    peer.send(RstStreamFrame(3, RstStatus.CANCEL))
    assert [type(e) for e in peer.send(syn(11))] == [StreamOpened]


def test_bad_header_block_costs_only_its_stream() -> None:
    peer = Peer()
    for bad in (b"\0\0\0\x01\0\0\0\x04Host\0\0\0\0", b"\0\0\0\x02\0\0\0\x01a\0\0\0\0" * 2):
        payload = struct.pack(">IIH", 1, 0, 0) + peer.encoder.compress(bad)
        assert peer.send_raw(struct.pack(">II", 0x80030001, len(payload)) + payload) == []
        assert peer.answers() == [RstStreamFrame(1, RstStatus.PROTOCOL_ERROR)]
    assert [type(e) for e in peer.send(syn(3))] == [StreamOpened]


def test_too_many_headers_reset_the_stream() -> None:
    peer = Peer(max_header_count=4)
    assert peer.send(SynStreamFrame(1, tuple((f"h{i}", "") for i in range(5)))) == []
    assert peer.answers() == [RstStreamFrame(1, RstStatus.PROTOCOL_ERROR)]


def test_zlib_bomb_ends_the_session_in_bounded_memory() -> None:
    peer = Peer()
    deflate = zlib.compressobj(9, zlib.DEFLATED, 15, 9, zdict=SPDY3_DICTIONARY)
    value = b"a" * (32 << 20)
    block = struct.pack(">II", 1, 1) + b"a" + struct.pack(">I", len(value)) + value
    bomb = deflate.compress(block) + deflate.flush(zlib.Z_SYNC_FLUSH)
    payload = struct.pack(">IIH", 1, 0, 0) + bomb
    tracemalloc.start()
    try:
        events = peer.send_raw(struct.pack(">II", 0x80030001, len(payload)) + payload)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    assert_terminated(peer, events)


def test_reply_faults_reset_the_stream() -> None:
    peer = Peer()
    sid = peer.server.open_stream({})
    peer.send(syn(1))
    events = peer.send(SynReplyFrame(sid), SynReplyFrame(sid), SynReplyFrame(1))
    assert events[1:] == [
        StreamReset(sid, RstStatus.STREAM_IN_USE, by_peer=False),
        StreamReset(1, RstStatus.PROTOCOL_ERROR, by_peer=False),
    ]
    assert peer.answers()[1:] == [
        RstStreamFrame(sid, RstStatus.STREAM_IN_USE),
        RstStreamFrame(1, RstStatus.PROTOCOL_ERROR),
    ]


def test_frames_that_need_no_answer_get_none() -> None:
    peer = Peer()
    events = peer.send(
        RstStreamFrame(41, RstStatus.CANCEL),
        WindowUpdateFrame(0, 1),
        WindowUpdateFrame(3, 0x7FFFFFFF),
        PingFrame(2),  # of the server's parity, never sent by it
        GoAwayFrame(0, 0xDEAD),
    )
    assert [type(e).__name__ for e in events] == ["GoAwayReceived"]
    assert peer.answers() == []


OPS = st.one_of(
    st.builds(syn, st.integers(1, 40), st.booleans()),
    st.builds(DataFrame, st.integers(1, 40), st.binary(max_size=20), st.booleans()),
    st.builds(SynReplyFrame, st.integers(1, 40), st.just(()), st.booleans()),
    st.builds(HeadersFrame, st.integers(1, 40), st.just((("a", "b"),)), st.booleans()),
    st.builds(RstStreamFrame, st.integers(1, 40), st.integers(1, 12)),
    st.builds(PingFrame, st.integers(1, 9)),
    st.builds(WindowUpdateFrame, st.integers(0, 40), st.integers(0, 100)),
)


@settings(max_examples=300)
@given(st.lists(OPS, max_size=40), st.lists(st.sampled_from(["reply", "data", "end", "reset"])))
def test_random_frames_only_make_events_and_answers(ops: list[Frame], actions: list[str]) -> None:
    peer = Peer(max_concurrent_streams=4)
    for frame, action in zip(ops, actions + ["none"] * len(ops), strict=False):
        for event in peer.send(frame):
            if isinstance(event, StreamOpened):
                act(peer.server, event.stream_id, action)
        assert len(peer.server.open_stream_ids) <= 4
        for answer in peer.answers():
            assert not isinstance(answer, HeadersFrame)
            assert getattr(answer, "stream_id", 1) != 0


def act(server: SpdyConnection, stream_id: int, action: str) -> None:
    if action == "reset":
        server.reset_stream(stream_id)
        return
    server.reply(stream_id)
    if action == "data":
        server.send_data(stream_id, b"hello")
    elif action == "end":
        server.end_stream(stream_id)


@given(st.binary(max_size=3000), st.integers(1, 64))
def test_garbage_never_raises(garbage: bytes, step: int) -> None:
    server = SpdyConnection(Role.SERVER, Limits(max_control_frame_length=2048))
    for start in range(0, len(garbage), step):
        server.receive_data(garbage[start : start + step])
    assert server.bytes_to_send < 100 * len(garbage) + 100
