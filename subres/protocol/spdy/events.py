"""Events a `SpdyConnection` reports for the bytes it received.

Each is a frozen dataclass named for what already happened. A remote
half-close is always reported as `StreamEnded`, after the event of the frame
that carried the FIN.
"""

from __future__ import annotations

from dataclasses import dataclass

from subres.protocol.spdy.frames import Setting
from subres.protocol.spdy.headers import Headers

__all__ = [
    "ConnectionTerminated",
    "DataReceived",
    "Event",
    "GoAwayReceived",
    "HeadersReceived",
    "PingAcknowledged",
    "PingReceived",
    "SettingsReceived",
    "StreamEnded",
    "StreamOpened",
    "StreamReplied",
    "StreamReset",
]


@dataclass(frozen=True, slots=True)
class StreamOpened:
    """The peer opened a stream (SYN_STREAM); answer with `reply` or `reset_stream`."""

    stream_id: int
    headers: Headers
    fin: bool = False
    associated_id: int = 0


@dataclass(frozen=True, slots=True)
class StreamReplied:
    """The peer accepted a stream this side opened (SYN_REPLY)."""

    stream_id: int
    headers: Headers
    fin: bool = False


@dataclass(frozen=True, slots=True)
class HeadersReceived:
    """The peer sent more headers on a stream (HEADERS)."""

    stream_id: int
    headers: Headers
    fin: bool = False


@dataclass(frozen=True, slots=True)
class DataReceived:
    """Payload arrived on a stream; `fin` when it was the last.

    `data` is a view of the bytes it arrived in (no copy): read-only, valid as
    long as it is kept."""

    stream_id: int
    data: bytes | memoryview
    fin: bool = False


@dataclass(frozen=True, slots=True)
class StreamEnded:
    """The peer half-closed a stream: it will send nothing more on it."""

    stream_id: int


@dataclass(frozen=True, slots=True)
class StreamReset:
    """A stream ended abnormally: reset by the peer, or by this side for a
    fault of the peer's (then `by_peer` is False and the RST_STREAM is queued)."""

    stream_id: int
    status: int
    by_peer: bool = True


@dataclass(frozen=True, slots=True)
class PingReceived:
    """The peer pinged; the echo is already queued."""

    ping_id: int


@dataclass(frozen=True, slots=True)
class PingAcknowledged:
    """The peer echoed a ping this side sent."""

    ping_id: int


@dataclass(frozen=True, slots=True)
class SettingsReceived:
    """The peer sent SETTINGS (informational: this codec applies none)."""

    entries: tuple[Setting, ...]


@dataclass(frozen=True, slots=True)
class GoAwayReceived:
    """The peer takes no stream after `last_stream_id`; streams of ours above it
    are reported reset (REFUSED_STREAM) right after this event."""

    last_stream_id: int
    status: int


@dataclass(frozen=True, slots=True)
class ConnectionTerminated:
    """The peer broke the protocol; a GOAWAY with `status` is queued and the
    connection takes no more input. Send what is queued, then close."""

    status: int
    reason: str


Event = (
    StreamOpened
    | StreamReplied
    | HeadersReceived
    | DataReceived
    | StreamEnded
    | StreamReset
    | PingReceived
    | PingAcknowledged
    | SettingsReceived
    | GoAwayReceived
    | ConnectionTerminated
)
