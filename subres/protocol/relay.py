"""The relay protocol between a subres replica and a node agent, sans I/O.

A replica asks an agent for one backend connection with one HTTP/1.1
request over mutual TLS::

    POST /relay HTTP/1.1
    Host: subres-agent.subres-system.svc
    Connection: Upgrade
    Upgrade: subres-relay.v1
    Subres-Endpoint: unix:///run/subres-machines/vm1/serial.sock
    Subres-Transport: stream          (or datagram, for UDP)
    Subres-For: Machine default/vm1   (for the agent's log only)

The agent vets the endpoint with its own policy and dials it first; only
then does it answer `101 Switching Protocols` (`Upgrade: subres-relay.v1`).
A refusal is an ordinary HTTP answer with a Kubernetes `Status` body: 403
when its policy forbids the endpoint, 502/503 when its dial failed.

After the 101 both directions carry frames: one type byte, a 4-byte
big-endian length, the payload. `DATA` carries bytes (in datagram mode,
exactly one datagram); `EOF` says the sender will send nothing more (a
half-close: the other direction keeps flowing); `ERROR` says the sender's
backend failed, with the reason as UTF-8, and ends the relay. Framing is
what lets a half-close and a failure cross TLS, which asyncio cannot
half-close, and keeps datagram boundaries. A connection that ends without
`EOF` or `ERROR` was lost: the agent or the replica died.

A network cut ends nothing by itself, so both ends of a relay may beat: when
the request says `Subres-Heartbeat: SECONDS` and the 101 says it back, each
end sends a `HEARTBEAT` frame (no payload) every that many seconds and drops
the connection once nothing at all arrived for `MISSED_BEATS` of them while it
was reading (`engine.heartbeat`). A decoder swallows heartbeats: they carry
nothing but the news that the other end is there. Ends that do not ask, or
do not answer, never send one, so either side may be older than the other.

Replicas relay sessions to each other with the same frames (`subres-peer.v1`,
see `sessions.peer`) plus two types that only a decoder made with `peer`
accepts: `RESIZE` (a console window's columns and rows, two big-endian
16-bit numbers), `CLOSE` (a close code, big-endian 16 bits, and its reason
as UTF-8: the session ended, and why, in the client's terms) and `EXIT` (the
exit status of the command the owner's backend ran, a big-endian signed
32-bit number, sent just before the owner's `EOF`, so that the front reports
it as a session of its own would).
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

__all__ = [
    "ENDPOINT_HEADER",
    "FOR_HEADER",
    "HEARTBEAT_HEADER",
    "MAX_FRAME",
    "MAX_HEARTBEAT",
    "MIN_HEARTBEAT",
    "MISSED_BEATS",
    "PATH",
    "TRANSPORT_HEADER",
    "UPGRADE",
    "CloseReceived",
    "Control",
    "DataReceived",
    "EofReceived",
    "ErrorReceived",
    "ExitReceived",
    "FrameDecoder",
    "FrameError",
    "FrameType",
    "ResizeReceived",
    "Transport",
    "close",
    "data",
    "eof",
    "error",
    "exit_status",
    "heartbeat",
    "heartbeat_interval",
    "resize",
]

PATH = "/relay"
UPGRADE = "subres-relay.v1"
ENDPOINT_HEADER = "Subres-Endpoint"
TRANSPORT_HEADER = "Subres-Transport"
FOR_HEADER = "Subres-For"
HEARTBEAT_HEADER = "Subres-Heartbeat"
MIN_HEARTBEAT = 0.1
MAX_HEARTBEAT = 60.0
"""The intervals (seconds) an end agrees to beat at; anything else is not beating."""
MISSED_BEATS = 4
"""Intervals of silence, while reading, after which an end drops the connection."""

MAX_FRAME = 4 << 20
"""The largest payload a decoder accepts: above any read size or datagram."""

_HEADER = struct.Struct(">BI")


class Transport(enum.Enum):
    """How the agent dials: a byte stream (tcp, unix) or datagrams (udp)."""

    STREAM = "stream"
    DATAGRAM = "datagram"


class FrameType(enum.IntEnum):
    """The first byte of a frame."""

    DATA = 0
    EOF = 1
    ERROR = 2
    RESIZE = 3
    CLOSE = 4
    HEARTBEAT = 5
    EXIT = 6


class FrameError(ValueError):
    """The peer sent something that is not a relay frame."""


@dataclass(frozen=True)
class DataReceived:
    """Bytes (or, in datagram mode, one datagram)."""

    data: bytes


@dataclass(frozen=True)
class EofReceived:
    """The peer will send nothing more."""


@dataclass(frozen=True)
class ErrorReceived:
    """The peer's backend failed; the relay is over."""

    reason: str


@dataclass(frozen=True)
class ResizeReceived:
    """A console window's new size (peer relays only)."""

    width: int
    height: int


@dataclass(frozen=True)
class CloseReceived:
    """The session is over, with the close code and reason for its client (peer relays only)."""

    code: int
    reason: str


@dataclass(frozen=True)
class ExitReceived:
    """The exit status of the command the sender's backend ran (peer relays only)."""

    code: int


Event = DataReceived | EofReceived | ErrorReceived | ResizeReceived | CloseReceived | ExitReceived
Control = ResizeReceived | CloseReceived | ExitReceived
"""The events only a peer decoder yields."""

_SIZE = struct.Struct(">HH")
_CODE = struct.Struct(">H")
_STATUS = struct.Struct(">i")
_HEARTBEAT = _HEADER.pack(FrameType.HEARTBEAT, 0)


def data(payload: bytes | memoryview) -> bytes:
    """A DATA frame carrying `payload`, as one write.

    Joined even when large: the relay always runs over TLS, where a header
    written apart costs a TLS record and a send of its own, more than the copy.
    """
    return _HEADER.pack(FrameType.DATA, len(payload)) + payload


def eof() -> bytes:
    """An EOF frame."""
    return _HEADER.pack(FrameType.EOF, 0)


def error(reason: str) -> bytes:
    """An ERROR frame with `reason` (cut to 1 KiB)."""
    payload = reason.encode()[:1024]
    return _HEADER.pack(FrameType.ERROR, len(payload)) + payload


def heartbeat() -> bytes:
    """A HEARTBEAT frame: the sender is there."""
    return _HEARTBEAT


def heartbeat_interval(text: str | None) -> float | None:
    """The interval a `Subres-Heartbeat` header asks for, or None (absent or unusable)."""
    try:
        seconds = float(text or "")
    except ValueError:
        return None
    return seconds if MIN_HEARTBEAT <= seconds <= MAX_HEARTBEAT else None


def resize(width: int, height: int) -> bytes:
    """A RESIZE frame (each dimension clamped to 0..65535)."""
    payload = _SIZE.pack(min(max(width, 0), 0xFFFF), min(max(height, 0), 0xFFFF))
    return _HEADER.pack(FrameType.RESIZE, len(payload)) + payload


def close(code: int, reason: str) -> bytes:
    """A CLOSE frame: `code` and `reason` (cut to 123 bytes, as a WebSocket close frame's)."""
    payload = _CODE.pack(code & 0xFFFF) + reason.encode()[:123]
    return _HEADER.pack(FrameType.CLOSE, len(payload)) + payload


def exit_status(code: int) -> bytes:
    """An EXIT frame: a command's exit status (clamped to a signed 32-bit number)."""
    payload = _STATUS.pack(min(max(code, -(1 << 31)), (1 << 31) - 1))
    return _HEADER.pack(FrameType.EXIT, len(payload)) + payload


class FrameDecoder:
    """Bytes in, frame events out, whatever the chunking; heartbeats are consumed.

    With `partial` (byte streams), a DATA payload is handed out as its bytes
    arrive, in as many events as the chunking makes: a chunk that is all
    payload goes out as it is, uncopied. Without it (datagrams), each DATA
    event is one whole frame.
    """

    __slots__ = ("_buffer", "_partial", "_peer", "_remaining")

    def __init__(self, *, partial: bool = False, peer: bool = False) -> None:
        self._buffer = bytearray()
        self._partial = partial
        self._peer = peer
        """RESIZE, CLOSE and EXIT frames are accepted (between replicas only)."""
        self._remaining = 0
        """Payload bytes of the current DATA frame still to come (partial mode)."""

    def feed(self, chunk: bytes) -> list[Event]:
        """The events completed by `chunk`; raises `FrameError` on a bad frame."""
        events: list[Event] = []
        if self._remaining:
            if len(chunk) <= self._remaining:
                self._remaining -= len(chunk)
                return [DataReceived(chunk)] if chunk else []
            events.append(DataReceived(chunk[: self._remaining]))
            chunk = chunk[self._remaining :]
            self._remaining = 0
        if self._buffer:
            self._buffer += chunk
            source: bytes | bytearray = self._buffer
        else:
            # The common case: nothing held back, so frames are cut from `chunk` itself.
            source = chunk
        offset = self._frames(source, events)
        if source is self._buffer:
            del self._buffer[:offset]
        elif offset < len(source):
            self._buffer = bytearray(chunk[offset:])
        return events

    def _frames(self, source: bytes | bytearray, events: list[Event]) -> int:
        """Append the frames that `source` holds to `events`; the bytes consumed."""
        offset = 0
        size = len(source)
        with memoryview(source) as view:
            while size - offset >= _HEADER.size:
                kind, length = _HEADER.unpack_from(view, offset)
                if length > MAX_FRAME:
                    raise FrameError(f"relay frame of {length} bytes exceeds {MAX_FRAME}")
                if kind == FrameType.HEARTBEAT and length:
                    raise FrameError("relay HEARTBEAT frame with a payload")
                start = offset + _HEADER.size
                end = start + length
                if end > size:
                    if self._partial and kind == FrameType.DATA:
                        if start < size:
                            events.append(DataReceived(bytes(view[start:])))
                        self._remaining = end - size
                        return size
                    break
                if kind != FrameType.HEARTBEAT:
                    events.append(_event(kind, bytes(view[start:end]), peer=self._peer))
                offset = end
        return offset


def _event(kind: int, payload: bytes, *, peer: bool) -> Event:
    if kind == FrameType.DATA:
        return DataReceived(payload)
    if kind == FrameType.EOF:
        if payload:
            raise FrameError("relay EOF frame with a payload")
        return EofReceived()
    if kind == FrameType.ERROR:
        return ErrorReceived(payload.decode(errors="replace"))
    if peer and kind == FrameType.RESIZE:
        if len(payload) != _SIZE.size:
            raise FrameError(f"relay RESIZE frame of {len(payload)} bytes, not {_SIZE.size}")
        return ResizeReceived(*_SIZE.unpack(payload))
    if peer and kind == FrameType.CLOSE:
        if len(payload) < _CODE.size:
            raise FrameError("relay CLOSE frame without a code")
        (code,) = _CODE.unpack_from(payload)
        return CloseReceived(code, payload[_CODE.size :].decode(errors="replace"))
    if peer and kind == FrameType.EXIT:
        if len(payload) != _STATUS.size:
            raise FrameError(f"relay EXIT frame of {len(payload)} bytes, not {_STATUS.size}")
        return ExitReceived(*_STATUS.unpack(payload))
    raise FrameError(f"unknown relay frame type {kind}")
