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
Every (state, input) pair missing from `_TRANSITIONS` is a fault: the
connection answers a peer's with RST_STREAM and refuses a caller's.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

__all__ = ["Stream", "StreamInput", "StreamState", "next_state"]


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

    def apply(self, event: StreamInput) -> bool:
        """Move to the state after `event`; return False (and stay) if not allowed."""
        state = next_state(self.state, event)
        if state is None:
            return False
        self.state = state
        return True

    @property
    def can_send(self) -> bool:
        """This side may still send DATA."""
        return self.state in (StreamState.OPEN, StreamState.HALF_CLOSED_REMOTE)

    @property
    def can_receive(self) -> bool:
        """The peer may still send DATA."""
        return self.state in (StreamState.OPEN, StreamState.HALF_CLOSED_LOCAL)
