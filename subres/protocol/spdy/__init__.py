"""SPDY/3.1 as Kubernetes speaks it, sans I/O: framing, header compression and
the session state machine.

`SpdyConnection` is the entry point for an I/O layer: feed it received bytes
with `receive_data`, act on the returned events, issue commands, and write
out `data_to_send()`. The lower modules (`frames`, `parser`, `headers`) are
public for tests and tools that need single frames.
"""

from subres.protocol.spdy.connection import Role, SpdyConnection
from subres.protocol.spdy.dictionary import SPDY3_DICTIONARY
from subres.protocol.spdy.errors import (
    ConnectionClosedError,
    HeaderBlockError,
    ProtocolError,
    SpdyError,
    StreamClosedError,
    StreamError,
    UsageError,
)
from subres.protocol.spdy.events import (
    ConnectionTerminated,
    DataReceived,
    Event,
    GoAwayReceived,
    HeadersReceived,
    PingAcknowledged,
    PingReceived,
    SettingsReceived,
    StreamEnded,
    StreamOpened,
    StreamReplied,
    StreamReset,
)
from subres.protocol.spdy.headers import Headers, HeadersLike
from subres.protocol.spdy.limits import Limits
from subres.protocol.spdy.status import GoAwayStatus, RstStatus
from subres.protocol.spdy.streams import StreamState

__all__ = [
    "SPDY3_DICTIONARY",
    "ConnectionClosedError",
    "ConnectionTerminated",
    "DataReceived",
    "Event",
    "GoAwayReceived",
    "GoAwayStatus",
    "HeaderBlockError",
    "Headers",
    "HeadersLike",
    "HeadersReceived",
    "Limits",
    "PingAcknowledged",
    "PingReceived",
    "ProtocolError",
    "Role",
    "RstStatus",
    "SettingsReceived",
    "SpdyConnection",
    "SpdyError",
    "StreamClosedError",
    "StreamEnded",
    "StreamError",
    "StreamOpened",
    "StreamReplied",
    "StreamReset",
    "StreamState",
    "UsageError",
]
