"""Exceptions of the SPDY codec.

Errors caused by the peer carry the status to put on the wire:
`ProtocolError` ends the session with a GOAWAY, `StreamError` ends one stream
with a RST_STREAM. Errors caused by the local caller (a command that the
current state does not allow) derive from `UsageError`.
"""

from __future__ import annotations

from subres.protocol.spdy.status import GoAwayStatus, RstStatus

__all__ = [
    "ConnectionClosedError",
    "HeaderBlockError",
    "ProtocolError",
    "SpdyError",
    "StreamClosedError",
    "StreamError",
    "UsageError",
]


class SpdyError(Exception):
    """Base of every error the SPDY codec raises."""


class ProtocolError(SpdyError):
    """The peer broke the protocol in a way that ends the whole session."""

    def __init__(self, message: str, status: GoAwayStatus = GoAwayStatus.PROTOCOL_ERROR) -> None:
        super().__init__(message)
        self.status = status


class StreamError(SpdyError):
    """The peer broke the protocol on one stream; the session survives."""

    def __init__(self, message: str, *, stream_id: int, status: RstStatus) -> None:
        super().__init__(message)
        self.stream_id = stream_id
        self.status = status


class HeaderBlockError(SpdyError):
    """A decompressed header block is malformed (bad lengths, names, counts).

    The shared zlib stream is still in step, so this costs only the stream
    whose frame carried the block.
    """


class UsageError(SpdyError):
    """A local command is not allowed in the current state."""


class StreamClosedError(UsageError):
    """A command named a stream that is unknown or closed for that command."""


class ConnectionClosedError(UsageError):
    """A command that needs a live session came after GOAWAY or termination."""
