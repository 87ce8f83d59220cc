"""The stream state table is strict: a transition it does not allow is an error, never a no-op."""

from __future__ import annotations

import re

import pytest

from subres.protocol.spdy import (
    Role,
    RstStatus,
    SpdyConnection,
    StreamClosedError,
    StreamEnded,
    StreamError,
    StreamReplied,
    StreamReset,
)
from subres.protocol.spdy.frames import DataFrame, SynReplyFrame, serialize
from subres.protocol.spdy.headers import HeaderEncoder
from subres.protocol.spdy.streams import Stream, StreamInput, StreamState

S, In = StreamState, StreamInput


@pytest.mark.parametrize(
    ("state", "event"),
    [
        (S.HALF_CLOSED_REMOTE, In.RECV_FIN),
        (S.CLOSED, In.RECV_RST),
        (S.OPEN, In.RECV_SYN),
        (S.IDLE, In.RECV_FIN),
    ],
)
def test_a_received_input_the_table_refuses_is_the_peers_stream_error(
    state: StreamState, event: StreamInput
) -> None:
    stream = Stream(3, local=False, state=state)
    with pytest.raises(StreamError) as refused:
        stream.apply(event)
    assert refused.value.stream_id == 3
    assert refused.value.status is RstStatus.STREAM_ALREADY_CLOSED
    assert stream.state is state


@pytest.mark.parametrize(
    ("state", "event"),
    [
        (S.HALF_CLOSED_LOCAL, In.SEND_FIN),
        (S.CLOSED, In.SEND_RST),
        (S.OPEN, In.SEND_SYN),
        (S.IDLE, In.SEND_FIN),
    ],
)
def test_a_sent_input_the_table_refuses_is_the_callers_error(
    state: StreamState, event: StreamInput
) -> None:
    stream = Stream(1, local=True, state=state)
    with pytest.raises(StreamClosedError, match=re.escape(f"stream 1, which is {state.value}")):
        stream.apply(event)
    assert stream.state is state


def test_allowed_inputs_walk_the_diagram() -> None:
    stream = Stream(1, local=True)
    for event, state in [
        (In.SEND_SYN, S.OPEN),
        (In.RECV_FIN, S.HALF_CLOSED_REMOTE),
        (In.SEND_FIN, S.CLOSED),
    ]:
        stream.apply(event)
        assert stream.state is state


def test_a_second_fin_from_the_peer_resets_the_stream_once() -> None:
    """DATA with FIN, then a SYN_REPLY with FIN: the stream ended once, then is reset."""
    client = SpdyConnection(Role.CLIENT)
    sid = client.open_stream({"streamtype": "data"})
    peer = HeaderEncoder()
    events = client.receive_data(
        serialize(DataFrame(sid, b"early", fin=True), peer)
        + serialize(SynReplyFrame(sid, (), fin=True), peer)
    )
    ended = [e for e in events if isinstance(e, StreamEnded)]
    resets = [e for e in events if isinstance(e, StreamReset)]
    assert len(ended) == 1
    assert [type(e) for e in events if isinstance(e, StreamReplied)] == [StreamReplied]
    assert [(r.stream_id, r.status, r.by_peer) for r in resets] == [
        (sid, RstStatus.STREAM_ALREADY_CLOSED, False)
    ]
