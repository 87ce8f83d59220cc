"""SPDY/3.1 status codes carried by RST_STREAM and GOAWAY frames.

This module owns the numeric codes only; which code answers which fault is
decided by the parser and the connection state machine.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["GoAwayStatus", "RstStatus", "SettingsId", "goaway_status", "rst_status"]


class RstStatus(IntEnum):
    """Status of a RST_STREAM frame (SPDY/3.1 section 2.6.3)."""

    PROTOCOL_ERROR = 1
    INVALID_STREAM = 2
    REFUSED_STREAM = 3
    UNSUPPORTED_VERSION = 4
    CANCEL = 5
    INTERNAL_ERROR = 6
    FLOW_CONTROL_ERROR = 7
    STREAM_IN_USE = 8
    STREAM_ALREADY_CLOSED = 9
    INVALID_CREDENTIALS = 10
    FRAME_TOO_LARGE = 11


class GoAwayStatus(IntEnum):
    """Status of a GOAWAY frame (SPDY/3.1 section 2.6.6)."""

    OK = 0
    PROTOCOL_ERROR = 1
    INTERNAL_ERROR = 2


class SettingsId(IntEnum):
    """Identifiers of SETTINGS entries (SPDY/3.1 section 2.6.4)."""

    UPLOAD_BANDWIDTH = 1
    DOWNLOAD_BANDWIDTH = 2
    ROUND_TRIP_TIME = 3
    MAX_CONCURRENT_STREAMS = 4
    CURRENT_CWND = 5
    DOWNLOAD_RETRANS_RATE = 6
    INITIAL_WINDOW_SIZE = 7
    CLIENT_CERTIFICATE_VECTOR_SIZE = 8


def rst_status(status: int) -> int:
    """A received RST_STREAM status as a RstStatus when known, else as it came."""
    try:
        return RstStatus(status)
    except ValueError:
        return status


def goaway_status(status: int) -> int:
    """A received GOAWAY status as a GoAwayStatus when known, else as it came."""
    try:
        return GoAwayStatus(status)
    except ValueError:
        return status
