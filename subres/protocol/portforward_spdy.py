"""Kubernetes port-forward over SPDY streams (`portforward.k8s.io`): the pairing rules, sans I/O.

Each forwarded connection is a pair of streams, `error` and `data`, whose
headers carry `streamtype`, `port` and `requestid`. kubelet's rules
(pkg/kubelet/cri/streaming/portforward/httpstream.go), kept here:

- a stream without a valid `port` (uint16 > 0) or `streamtype` is refused
  (reset) before it joins any pair;
- streams pair up by `requestid`; an old client that sends none gets one
  derived from the stream id (error: its id, data: its id - 2);
- a pair waits up to 30 s for its other half, then its error stream is told
  so in plain text;
- a second stream of a type a pending pair already has is reported on that
  pair's error stream.

No clock: callers pass `now` and ask `expire(now)` at `next_deadline`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from subres.protocol import digits

__all__ = [
    "DATA",
    "ERROR",
    "PAIRING_TIMEOUT",
    "PORT_HEADER",
    "PROTOCOL",
    "REQUEST_ID_HEADER",
    "STREAM_TYPE_HEADER",
    "TUNNEL_PROTOCOL",
    "PairCompleted",
    "PairTimedOut",
    "Pairing",
    "PortStream",
    "StreamDuplicated",
    "StreamRefused",
    "check",
    "header",
]

PROTOCOL = "portforward.k8s.io"
TUNNEL_PROTOCOL = "SPDY/3.1+" + PROTOCOL
"""The WebSocket subprotocol of SPDY tunnelled in binary messages (kubectl >= 1.31)."""
STREAM_TYPE_HEADER = "streamtype"
PORT_HEADER = "port"
REQUEST_ID_HEADER = "requestid"
ERROR = "error"
DATA = "data"
PAIRING_TIMEOUT = 30.0
"""Seconds a pair waits for its second stream (kubelet's stream creation timeout)."""


class StreamRefused(ValueError):
    """A stream's headers make it unusable; reset it. The message says why."""


@dataclass(frozen=True)
class PortStream:
    """A stream whose headers passed the checks."""

    stream_id: int
    kind: str
    """`error` or `data`."""
    port: int
    request_id: str


@dataclass(frozen=True)
class PairCompleted:
    """Both streams of a forwarded connection arrived: forward `port`."""

    request_id: str
    error_id: int
    data_id: int
    port: int


@dataclass(frozen=True)
class StreamDuplicated:
    """A pending pair got a second stream of one type: reset `stream_id` and
    write `message` on `error_id` when the pair has an error stream."""

    request_id: str
    stream_id: int
    error_id: int | None
    message: str


@dataclass(frozen=True)
class PairTimedOut:
    """A pair's second stream never came: write `message` on `error_id` (if any),
    then end the streams it has."""

    request_id: str
    error_id: int | None
    data_id: int | None
    message: str


def header(headers: Iterable[tuple[str, str]], name: str) -> str:
    """The first value of header `name` (lowercase), or "" when absent."""
    return next((value for key, value in headers if key == name), "")


def check(stream_id: int, headers: Iterable[tuple[str, str]]) -> PortStream:
    """Validate one stream's headers as kubelet does; raises `StreamRefused`."""
    pairs = tuple(headers)
    port_text = header(pairs, PORT_HEADER)
    if not port_text:
        raise StreamRefused(f'"{PORT_HEADER}" header is required')
    port = _port(port_text)
    kind = header(pairs, STREAM_TYPE_HEADER)
    if not kind:
        raise StreamRefused(f'"{STREAM_TYPE_HEADER}" header is required')
    if kind not in (ERROR, DATA):
        raise StreamRefused(f"invalid stream type {kind!r}")
    request_id = header(pairs, REQUEST_ID_HEADER)
    if not request_id:
        # Old clients send no request id; kubelet derives one, which pairs
        # correctly as long as their connections do not open concurrently.
        request_id = str(stream_id if kind == ERROR else stream_id - 2)
    return PortStream(stream_id, kind, port, request_id)


def _port(text: str) -> int:
    port = digits.value(text, cap=0xFFFF) if digits.plain(text) else 0xFFFF + 1
    if port > 0xFFFF:
        raise StreamRefused(f"unable to parse {text!r} as a port")
    if port < 1:
        raise StreamRefused(f"port {text!r} must be > 0")
    return port


@dataclass
class _Pending:
    deadline: float
    error: PortStream | None = None
    data: PortStream | None = None


class Pairing:
    """The pairs of one connection still waiting for a stream."""

    def __init__(self, *, timeout: float = PAIRING_TIMEOUT) -> None:
        self.timeout = timeout
        self._pending: dict[str, _Pending] = {}

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, stream: PortStream, *, now: float) -> PairCompleted | StreamDuplicated | None:
        """File `stream`; a completed pair leaves the table."""
        pair = self._pending.setdefault(stream.request_id, _Pending(now + self.timeout))
        if (pair.error if stream.kind == ERROR else pair.data) is not None:
            error_id = pair.error.stream_id if pair.error else None
            message = (
                f"error processing stream for request {stream.request_id}: "
                f"{stream.kind} stream already assigned"
            )
            return StreamDuplicated(stream.request_id, stream.stream_id, error_id, message)
        if stream.kind == ERROR:
            pair.error = stream
        else:
            pair.data = stream
        if pair.error is None or pair.data is None:
            return None
        del self._pending[stream.request_id]
        return PairCompleted(
            stream.request_id, pair.error.stream_id, pair.data.stream_id, pair.data.port
        )

    def next_deadline(self) -> float | None:
        """When the oldest pending pair times out, or None when none waits."""
        return min((p.deadline for p in self._pending.values()), default=None)

    def expire(self, now: float) -> list[PairTimedOut]:
        """Drop and report the pairs whose time is up."""
        expired = [rid for rid, pair in self._pending.items() if pair.deadline <= now]
        events = []
        for request_id in expired:
            pair = self._pending.pop(request_id)
            events.append(
                PairTimedOut(
                    request_id,
                    pair.error.stream_id if pair.error else None,
                    pair.data.stream_id if pair.data else None,
                    f"request {request_id}: timed out waiting for streams",
                )
            )
        return events
