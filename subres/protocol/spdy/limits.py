"""Resource limits of one SPDY session.

Every buffer and table the codec keeps has its bound here, so a hostile peer
can make the codec refuse work but never grow its memory without end.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MAX_FRAME_LENGTH", "Limits"]

MAX_FRAME_LENGTH = 0xFFFFFF
"""The largest length a frame header's 24-bit field can carry."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """Bounds a `SpdyConnection` enforces on what it receives and sends."""

    max_control_frame_length: int = 1 << 20
    """Largest control frame payload accepted; a longer one ends the session."""

    max_data_frame_length: int = MAX_FRAME_LENGTH
    """Largest DATA payload accepted; a longer one resets its stream (FRAME_TOO_LARGE)."""

    max_buffered_data: int = 64 * 1024
    """DATA frames up to this length arrive whole; longer ones arrive in pieces as
    the bytes come, so the parser never holds more than this of one frame."""

    max_header_block_size: int = 64 * 1024
    """Largest decompressed header block; more ends the session (zlib bombs)."""

    max_header_count: int = 100
    """Most header names in one block; more resets the stream."""

    max_concurrent_streams: int = 1000
    """Most streams the peer may hold open at once; more are refused (REFUSED_STREAM)."""

    max_send_frame_size: int = 64 * 1024
    """`send_data` splits its payload into DATA frames of at most this many bytes."""

    max_outstanding_pings: int = 64
    """Pings of ours remembered while unanswered; the oldest is forgotten first."""

    max_remembered_resets: int = 256
    """Streams we reset whose late frames are dropped silently instead of
    answered with another RST_STREAM."""

    def __post_init__(self) -> None:
        for name in self.__dataclass_fields__:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive")
        for name in ("max_control_frame_length", "max_data_frame_length", "max_send_frame_size"):
            if getattr(self, name) > MAX_FRAME_LENGTH:
                raise ValueError(f"{name} must fit in 24 bits")
