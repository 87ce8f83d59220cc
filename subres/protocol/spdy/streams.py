"""The life of one SPDY stream: its states and the transitions between them.

SPDY/3.1 (sections 2.3.6-2.3.7) names no states, only half-closing by FIN and
resetting by RST_STREAM; these are h2's names for the same life::

                           +--------+
              send SYN     |        |     recv SYN
            ,--------------|  IDLE  |--------------.
           /               |        |               \\
          v                +--------+                v
                           +--------+
                           |        |
              send FIN     |  OPEN  |     recv FIN
            ,--------------|        |--------------.
           /               +--------+               \\
          v                    |                     v
    +----------+               |              +-----------+
    |   HALF   |               |              |   HALF    |
    |  CLOSED  |               | send RST /   |  CLOSED   |
    |  LOCAL   |               | recv RST     |  REMOTE   |
    +----------+               |              +-----------+
          |                    v                     |
          |  recv FIN /    +--------+    send FIN /  |
          |  send or recv  |        |  send or recv  |
          `--------------->| CLOSED |<---------------'
              RST          |        |     RST
                           +--------+

A SYN carrying FIN opens and half-closes in one step (two transitions).
Every (state, input) pair missing from `_TRANSITIONS` is a fault, and
`Stream.apply` raises for it: a received input is the peer's fault
(`StreamError`, answered with RST_STREAM), a sent one the caller's
(`StreamClosedError`). The connection checks what it can before applying;
the table is the last word.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from subres.protocol.spdy.errors import StreamClosedError, StreamError
from subres.protocol.spdy.status import RstStatus

__all__ = ["Stream", "StreamInput", "StreamState", "StreamTable", "next_state"]


class StreamState(Enum):
    """Where a stream is in its life."""

    IDLE = "idle"
    OPEN = "open"
    HALF_CLOSED_LOCAL = "half-closed (local)"
    HALF_CLOSED_REMOTE = "half-closed (remote)"
    CLOSED = "closed"


class StreamInput(Enum):
    """What can happen to a stream: a frame sent or received."""

    SEND_SYN = "send SYN_STREAM"
    RECV_SYN = "recv SYN_STREAM"
    SEND_FIN = "send FIN"
    RECV_FIN = "recv FIN"
    SEND_RST = "send RST_STREAM"
    RECV_RST = "recv RST_STREAM"


_S = StreamState
_I = StreamInput

# The diagram above as a table: (state, input) -> next state.
_TRANSITIONS: dict[tuple[StreamState, StreamInput], StreamState] = {
    (_S.IDLE, _I.SEND_SYN): _S.OPEN,
    (_S.IDLE, _I.RECV_SYN): _S.OPEN,
    (_S.OPEN, _I.SEND_FIN): _S.HALF_CLOSED_LOCAL,
    (_S.OPEN, _I.RECV_FIN): _S.HALF_CLOSED_REMOTE,
    (_S.OPEN, _I.SEND_RST): _S.CLOSED,
    (_S.OPEN, _I.RECV_RST): _S.CLOSED,
    (_S.HALF_CLOSED_LOCAL, _I.RECV_FIN): _S.CLOSED,
    (_S.HALF_CLOSED_LOCAL, _I.SEND_RST): _S.CLOSED,
    (_S.HALF_CLOSED_LOCAL, _I.RECV_RST): _S.CLOSED,
    (_S.HALF_CLOSED_REMOTE, _I.SEND_FIN): _S.CLOSED,
    (_S.HALF_CLOSED_REMOTE, _I.SEND_RST): _S.CLOSED,
    (_S.HALF_CLOSED_REMOTE, _I.RECV_RST): _S.CLOSED,
}


_RECEIVED = frozenset({_I.RECV_SYN, _I.RECV_FIN, _I.RECV_RST})


def next_state(state: StreamState, event: StreamInput) -> StreamState | None:
    """Return the state after `event`, or None when `event` is not allowed."""
    return _TRANSITIONS.get((state, event))


@dataclass(slots=True)
class Stream:
    """What the connection remembers of one live stream."""

    stream_id: int
    local: bool
    """True when this side opened the stream."""
    state: StreamState = StreamState.IDLE
    replied: bool = False
    """A SYN_REPLY went the right way: received for a local stream, sent for a peer's."""

    def apply(self, event: StreamInput) -> None:
        """Move to the state after `event`; raise (and stay) if the table does not allow it."""
        state = next_state(self.state, event)
        if state is None:
            message = f"{event.value} on stream {self.stream_id}, which is {self.state.value}"
            if event in _RECEIVED:
                raise StreamError(
                    message, stream_id=self.stream_id, status=RstStatus.STREAM_ALREADY_CLOSED
                )
            raise StreamClosedError(message)
        self.state = state

    @property
    def can_send(self) -> bool:
        """This side may still send DATA."""
        return self.state in (StreamState.OPEN, StreamState.HALF_CLOSED_REMOTE)

    @property
    def can_receive(self) -> bool:
        """The peer may still send DATA."""
        return self.state in (StreamState.OPEN, StreamState.HALF_CLOSED_LOCAL)


class StreamTable:
    """The live streams of a session and what it must remember of the dead.

    Closed streams are forgotten at once; what remains of them is the id
    counters (an id below them was used) and a bounded memory of the streams
    this side reset, whose late frames are dropped rather than answered.
    """

    def __init__(self, *, local_parity: int, max_remembered_resets: int) -> None:
        self.parity = local_parity
        self.next_local_id = 1 if local_parity else 2
        self.last_peer_id = 0
        self.peer_count = 0
        self._live: dict[int, Stream] = {}
        self._resets: dict[int, None] = {}
        self._max_resets = max_remembered_resets

    def __len__(self) -> int:
        return len(self._live)

    def ids(self) -> tuple[int, ...]:
        """Ids of the live streams, in the order they opened."""
        return tuple(self._live)

    def get(self, stream_id: int) -> Stream | None:
        """The live stream with this id, if any."""
        return self._live.get(stream_id)

    def local_streams_above(self, stream_id: int) -> list[Stream]:
        """Live streams this side opened with ids above `stream_id`."""
        return [s for s in self._live.values() if s.local and s.stream_id > stream_id]

    def add(self, stream: Stream) -> None:
        """Start tracking a stream that was just opened."""
        self._live[stream.stream_id] = stream
        if not stream.local:
            self.peer_count += 1

    def forget(self, stream: Stream) -> None:
        """Drop a stream that has closed."""
        del self._live[stream.stream_id]
        if not stream.local:
            self.peer_count -= 1

    def clear(self) -> None:
        """Drop every stream (the session ended)."""
        self._live.clear()
        self.peer_count = 0

    def is_used(self, stream_id: int) -> bool:
        """The id was opened at some time by either side."""
        if stream_id % 2 == self.parity:
            return stream_id < self.next_local_id
        return stream_id <= self.last_peer_id

    def state_of(self, stream_id: int) -> StreamState:
        """The state of a stream; ids never used are IDLE, forgotten ones CLOSED."""
        stream = self._live.get(stream_id)
        if stream is not None:
            return stream.state
        return StreamState.CLOSED if self.is_used(stream_id) else StreamState.IDLE

    def remember_reset(self, stream_id: int) -> None:
        """Note that this side reset the stream; the oldest note goes first."""
        self._resets[stream_id] = None
        if len(self._resets) > self._max_resets:
            del self._resets[next(iter(self._resets))]

    def was_reset(self, stream_id: int) -> bool:
        """This side reset the stream recently."""
        return stream_id in self._resets
