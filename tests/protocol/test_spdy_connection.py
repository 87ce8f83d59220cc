"""A back-to-back client and server `SpdyConnection` pair."""

from __future__ import annotations

import pytest

from subres.protocol.spdy import (
    ConnectionClosedError,
    DataReceived,
    Event,
    GoAwayReceived,
    GoAwayStatus,
    Limits,
    PingAcknowledged,
    PingReceived,
    Role,
    RstStatus,
    SpdyConnection,
    StreamClosedError,
    StreamEnded,
    StreamOpened,
    StreamReplied,
    StreamReset,
    StreamState,
    UsageError,
)
from subres.protocol.spdy.frames import DataFrame, Frame
from subres.protocol.spdy.headers import HeaderDecoder
from subres.protocol.spdy.parser import FrameParser


def pair(**limits: int) -> tuple[SpdyConnection, SpdyConnection]:
    return SpdyConnection(Role.CLIENT, Limits(**limits)), SpdyConnection(Role.SERVER)


def pump(a: SpdyConnection, b: SpdyConnection) -> tuple[list[Event], list[Event]]:
    """Carry bytes both ways until both are quiet; return what a and b saw."""
    seen_a: list[Event] = []
    seen_b: list[Event] = []
    for _ in range(20):
        if not a.bytes_to_send and not b.bytes_to_send:
            return seen_a, seen_b
        seen_b += b.receive_data(a.data_to_send())
        seen_a += a.receive_data(b.data_to_send())
    raise AssertionError("the pair never went quiet")


def wire_frames(data: bytes) -> list[Frame]:
    parser = FrameParser(HeaderDecoder(max_block_size=1 << 16, max_count=100), Limits())
    parser.feed(data)
    frames: list[Frame] = []
    for _ in range(len(data)):
        frame = parser.next_frame()
        if frame is None:
            break
        frames.append(frame)
    return frames


def received(events: list[Event], stream_id: int) -> bytes:
    return b"".join(
        e.data for e in events if isinstance(e, DataReceived) and e.stream_id == stream_id
    )


def test_nothing_is_queued_before_input_or_command() -> None:
    client, server = pair()
    assert client.bytes_to_send == server.bytes_to_send == 0
    assert server.data_to_send() == b""


def test_stream_lifecycle_both_ways() -> None:
    client, server = pair()
    sid = client.open_stream({"streamtype": "data", "port": "8080", "requestid": "0"})
    assert client.stream_state(sid) is StreamState.OPEN
    _, at_server = pump(client, server)
    assert at_server == [
        StreamOpened(sid, (("streamtype", "data"), ("port", "8080"), ("requestid", "0")))
    ]
    server.reply(sid)
    server.send_data(sid, b"from server")
    client.send_data(sid, b"from client")
    at_client, at_server = pump(client, server)
    assert at_client == [StreamReplied(sid, ()), DataReceived(sid, b"from server")]
    assert at_server == [DataReceived(sid, b"from client")]

    client.end_stream(sid)
    assert client.stream_state(sid) is StreamState.HALF_CLOSED_LOCAL
    _, at_server = pump(client, server)
    assert at_server == [StreamEnded(sid)]
    assert server.stream_state(sid) is StreamState.HALF_CLOSED_REMOTE
    server.send_data(sid, b"last", fin=True)
    at_client, _ = pump(client, server)
    assert at_client == [DataReceived(sid, b"last", fin=True), StreamEnded(sid)]
    assert client.open_stream_ids == server.open_stream_ids == ()
    assert client.stream_state(sid) is server.stream_state(sid) is StreamState.CLOSED


def test_stream_ids_have_the_opener_parity_and_increase() -> None:
    client, server = pair()
    assert [client.open_stream({"n": str(i)}) for i in range(4)] == [1, 3, 5, 7]
    assert [server.open_stream({}) for _ in range(3)] == [2, 4, 6]
    at_client, at_server = pump(client, server)
    assert [e.stream_id for e in at_server if isinstance(e, StreamOpened)] == [1, 3, 5, 7]
    assert [e.stream_id for e in at_client if isinstance(e, StreamOpened)] == [2, 4, 6]
    assert client.stream_state(9) is StreamState.IDLE


def test_syn_with_fin_opens_half_closed() -> None:
    client, server = pair()
    sid = client.open_stream({"a": "b"}, fin=True)
    _, at_server = pump(client, server)
    assert at_server == [StreamOpened(sid, (("a", "b"),), fin=True), StreamEnded(sid)]
    server.reply(sid, {"x": "y"}, fin=True)
    at_client, _ = pump(client, server)
    assert at_client == [StreamReplied(sid, (("x", "y"),), fin=True), StreamEnded(sid)]
    assert client.open_stream_ids == server.open_stream_ids == ()


def test_send_data_splits_into_bounded_frames() -> None:
    client, _ = pair(max_send_frame_size=1000)
    sid = client.open_stream({})
    payload = bytes(range(256)) * 10
    client.send_data(sid, payload, fin=True)
    client.send_data(client.open_stream({}), b"")  # queues no empty DATA frame
    frames = wire_frames(client.data_to_send())
    data = [f for f in frames if isinstance(f, DataFrame)]
    assert len(frames) == 5
    assert [(len(f.data), f.fin) for f in data] == [(1000, False), (1000, False), (560, True)]
    assert b"".join(f.data for f in data) == payload


def test_large_transfer_never_waits_for_window_updates() -> None:
    client, server = pair()
    sid = client.open_stream({})
    pump(client, server)
    server.reply(sid)
    payload = bytes(3 << 20)
    server.send_data(sid, payload)
    assert server.bytes_to_send > len(payload)
    at_client, _ = pump(client, server)
    assert received(at_client, sid) == payload


def test_data_to_send_in_parts_and_bytes_to_send() -> None:
    client, _ = pair()
    client.open_stream({"a": "b"})
    total = client.bytes_to_send
    head = client.data_to_send(5)
    assert len(head) == 5
    assert client.bytes_to_send == total - 5
    assert len(client.data_to_send()) == total - 5
    assert client.bytes_to_send == 0


def test_reset_by_either_side() -> None:
    client, server = pair()
    first, second = client.open_stream({}), client.open_stream({})
    pump(client, server)
    server.reply(first)
    server.reply(second)
    server.send_data(first, b"in flight")
    client.reset_stream(first)
    at_server = server.receive_data(client.data_to_send())
    assert at_server == [StreamReset(first, RstStatus.CANCEL)]
    at_client = client.receive_data(server.data_to_send())
    assert at_client == [StreamReplied(second, ())]  # the reply to the reset one is dropped
    assert client.bytes_to_send == 0  # late data on a stream we reset is dropped unanswered
    with pytest.raises(StreamClosedError):
        client.send_data(first, b"x")
    with pytest.raises(StreamClosedError):
        server.send_data(first, b"x")
    client.reset_stream(first)  # resetting a closed stream is a no-op
    assert client.bytes_to_send == 0

    server.reset_stream(second, RstStatus.INTERNAL_ERROR)
    at_client, _ = pump(client, server)
    assert at_client == [StreamReset(second, RstStatus.INTERNAL_ERROR)]
    assert client.open_stream_ids == server.open_stream_ids == ()


def test_ping_echo_both_ways() -> None:
    client, server = pair()
    ping_id = client.ping()
    assert ping_id % 2 == 1
    at_client, at_server = pump(client, server)
    assert at_server == [PingReceived(ping_id)]
    assert at_client == [PingAcknowledged(ping_id)]
    server_ping = server.ping()
    assert server_ping % 2 == 0
    at_client, at_server = pump(client, server)
    assert (at_client, at_server) == ([PingReceived(server_ping)], [PingAcknowledged(server_ping)])
    assert client.ping() == ping_id + 2


def test_goaway_refuses_new_streams() -> None:
    client, server = pair()
    kept = client.open_stream({})
    pump(client, server)
    in_flight = client.open_stream({})
    server.goaway()
    server.goaway()  # once only
    at_client, at_server = pump(client, server)
    assert at_server == []  # the SYN_STREAM that crossed the GOAWAY is ignored
    assert at_client == [
        GoAwayReceived(kept, GoAwayStatus.OK),
        StreamReset(in_flight, RstStatus.REFUSED_STREAM),
    ]
    assert client.goaway_received and server.goaway_sent
    with pytest.raises(ConnectionClosedError):
        client.open_stream({})
    with pytest.raises(ConnectionClosedError):
        server.open_stream({})
    server.reply(kept)
    server.send_data(kept, b"still served", fin=True)
    at_client, _ = pump(client, server)
    assert received(at_client, kept) == b"still served"


def test_close_resets_streams_then_goes_away() -> None:
    client, server = pair()
    streams = [client.open_stream({}) for _ in range(3)]
    pump(client, server)
    server.close()
    at_client, _ = pump(client, server)
    assert at_client == [StreamReset(s, RstStatus.CANCEL) for s in streams] + [
        GoAwayReceived(streams[-1], GoAwayStatus.OK)
    ]
    assert client.open_stream_ids == server.open_stream_ids == ()


def test_commands_the_state_does_not_allow() -> None:
    client, server = pair()
    sid = client.open_stream({})
    pump(client, server)
    with pytest.raises(UsageError, match="reply"):
        server.send_data(sid, b"too early")
    with pytest.raises(UsageError):
        client.reply(sid)  # the opener does not reply
    server.reply(sid)
    with pytest.raises(UsageError):
        server.reply(sid)
    with pytest.raises(StreamClosedError):
        server.send_data(99, b"")
    client.end_stream(sid)
    with pytest.raises(StreamClosedError):
        client.send_data(sid, b"after fin")
    with pytest.raises(ValueError):
        client.open_stream({"Upper": "case"})
    assert client.open_stream({}) == sid + 2  # a refused command costs no id
