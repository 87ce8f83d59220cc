"""SPDY/3.1 frames: their dataclasses, their serialization and payload decoding.

Every frame starts with 8 bytes, big-endian::

    control: 1 | version (15) | type (16) | flags (8) | length (24)
    data:    0 | stream id (31)           | flags (8) | length (24)

A frame object holds decoded values only; header blocks are compressed by the
session's `HeaderEncoder` on the way out and decompressed by its
`HeaderDecoder` on the way in. Constructors refuse values the wire cannot carry
and ids the Go peer rejects (stream or ping id 0), so a frame that exists can
be sent. Reading frames from a byte stream is `parser.FrameParser`'s job.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum

from subres.protocol.spdy.errors import HeaderBlockError, ProtocolError, StreamError
from subres.protocol.spdy.headers import HeaderDecoder, HeaderEncoder, Headers
from subres.protocol.spdy.limits import MAX_FRAME_LENGTH
from subres.protocol.spdy.status import RstStatus

__all__ = [
    "FLAG_CLEAR_SETTINGS",
    "FLAG_FIN",
    "FLAG_UNIDIRECTIONAL",
    "HEADER_LENGTH",
    "VERSION",
    "DataFrame",
    "Frame",
    "FrameType",
    "GoAwayFrame",
    "HeadersFrame",
    "PingFrame",
    "RstStreamFrame",
    "Setting",
    "SettingsFrame",
    "SynReplyFrame",
    "SynStreamFrame",
    "WindowUpdateFrame",
    "data_frame_header",
    "decode_control",
    "serialize",
]

VERSION = 3
HEADER_LENGTH = 8
FLAG_FIN = 0x01
FLAG_UNIDIRECTIONAL = 0x02
FLAG_CLEAR_SETTINGS = 0x01

_MAX_ID = 0x7FFFFFFF
_MAX_U32 = 0xFFFFFFFF
_U32 = struct.Struct(">I")
_TWO_U32 = struct.Struct(">II")


class FrameType(IntEnum):
    """Control frame types this codec knows; others are skipped when read."""

    SYN_STREAM = 1
    SYN_REPLY = 2
    RST_STREAM = 3
    SETTINGS = 4
    PING = 6
    GOAWAY = 7
    HEADERS = 8
    WINDOW_UPDATE = 9


def _check(value: int, low: int, high: int, what: str) -> None:
    if not low <= value <= high:
        raise ValueError(f"{what} {value} is outside [{low}, {high}]")


@dataclass(frozen=True, slots=True)
class DataFrame:
    """DATA: a payload on a stream; FIN half-closes the sender's side."""

    stream_id: int
    data: bytes | memoryview = b""
    """A received payload is a view of the bytes it arrived in."""
    fin: bool = False

    def __post_init__(self) -> None:
        _check(self.stream_id, 1, _MAX_ID, "stream id")
        _check(len(self.data), 0, MAX_FRAME_LENGTH, "data length")


@dataclass(frozen=True, slots=True)
class SynStreamFrame:
    """SYN_STREAM: opens a stream with its request headers."""

    stream_id: int
    headers: Headers
    associated_id: int = 0
    priority: int = 0
    slot: int = 0
    fin: bool = False
    unidirectional: bool = False

    def __post_init__(self) -> None:
        _check(self.stream_id, 1, _MAX_ID, "stream id")
        _check(self.associated_id, 0, _MAX_ID, "associated stream id")
        _check(self.priority, 0, 7, "priority")
        _check(self.slot, 0, 0xFF, "slot")


@dataclass(frozen=True, slots=True)
class SynReplyFrame:
    """SYN_REPLY: accepts a stream the peer opened."""

    stream_id: int
    headers: Headers = ()
    fin: bool = False

    def __post_init__(self) -> None:
        _check(self.stream_id, 1, _MAX_ID, "stream id")


@dataclass(frozen=True, slots=True)
class RstStreamFrame:
    """RST_STREAM: ends a stream abnormally with a status."""

    stream_id: int
    status: int

    def __post_init__(self) -> None:
        _check(self.stream_id, 1, _MAX_ID, "stream id")
        _check(self.status, 1, _MAX_U32, "status")


@dataclass(frozen=True, slots=True)
class Setting:
    """One SETTINGS entry."""

    id: int
    value: int
    flags: int = 0

    def __post_init__(self) -> None:
        _check(self.id, 0, 0xFFFFFF, "setting id")
        _check(self.value, 0, _MAX_U32, "setting value")
        _check(self.flags, 0, 0xFF, "setting flags")


@dataclass(frozen=True, slots=True)
class SettingsFrame:
    """SETTINGS: session parameters of the sender."""

    entries: tuple[Setting, ...] = ()
    clear: bool = False


@dataclass(frozen=True, slots=True)
class PingFrame:
    """PING: echoed by the side that did not start it."""

    ping_id: int

    def __post_init__(self) -> None:
        _check(self.ping_id, 1, _MAX_U32, "ping id")


@dataclass(frozen=True, slots=True)
class GoAwayFrame:
    """GOAWAY: the sender takes no new streams after `last_stream_id`."""

    last_stream_id: int
    status: int = 0

    def __post_init__(self) -> None:
        _check(self.last_stream_id, 0, _MAX_ID, "last stream id")
        _check(self.status, 0, _MAX_U32, "status")


@dataclass(frozen=True, slots=True)
class HeadersFrame:
    """HEADERS: more headers on an open stream (read, never sent to Go peers)."""

    stream_id: int
    headers: Headers
    fin: bool = False

    def __post_init__(self) -> None:
        _check(self.stream_id, 1, _MAX_ID, "stream id")


@dataclass(frozen=True, slots=True)
class WindowUpdateFrame:
    """WINDOW_UPDATE: flow-control credit (stream 0 is the whole session)."""

    stream_id: int
    delta: int

    def __post_init__(self) -> None:
        _check(self.stream_id, 0, _MAX_ID, "stream id")
        _check(self.delta, 0, _MAX_ID, "delta")


Frame = (
    DataFrame
    | SynStreamFrame
    | SynReplyFrame
    | RstStreamFrame
    | SettingsFrame
    | PingFrame
    | GoAwayFrame
    | HeadersFrame
    | WindowUpdateFrame
)


def _fin(fin: bool) -> int:
    return FLAG_FIN if fin else 0


def data_frame_header(stream_id: int, length: int, *, fin: bool) -> bytes:
    """Return the 8 bytes that precede a DATA payload of `length` bytes."""
    return _TWO_U32.pack(stream_id, _fin(fin) << 24 | length)


def serialize(frame: Frame, encoder: HeaderEncoder) -> bytes:
    """Return the wire bytes of `frame`, compressing headers with `encoder`."""
    if isinstance(frame, DataFrame):
        return data_frame_header(frame.stream_id, len(frame.data), fin=frame.fin) + frame.data
    frame_type, flags, payload = _control_parts(frame, encoder)
    if len(payload) > MAX_FRAME_LENGTH:
        raise ValueError("control frame payload over 2^24-1 bytes")
    first = 0x80000000 | VERSION << 16 | frame_type
    return _TWO_U32.pack(first, flags << 24 | len(payload)) + payload


def _control_parts(frame: Frame, encoder: HeaderEncoder) -> tuple[FrameType, int, bytes]:
    """The type, flags and payload of a control frame."""
    match frame:
        case SynStreamFrame():
            flags = _fin(frame.fin) | (FLAG_UNIDIRECTIONAL if frame.unidirectional else 0)
            fields = struct.pack(
                ">IIBB", frame.stream_id, frame.associated_id, frame.priority << 5, frame.slot
            )
            parts = (FrameType.SYN_STREAM, flags, fields + encoder.encode(frame.headers))
        case SynReplyFrame(stream_id, headers, fin):
            parts = (FrameType.SYN_REPLY, _fin(fin), _U32.pack(stream_id) + encoder.encode(headers))
        case HeadersFrame(stream_id, headers, fin):
            parts = (FrameType.HEADERS, _fin(fin), _U32.pack(stream_id) + encoder.encode(headers))
        case RstStreamFrame(stream_id, status):
            parts = (FrameType.RST_STREAM, 0, _TWO_U32.pack(stream_id, status))
        case SettingsFrame(entries, clear):
            body = b"".join(_TWO_U32.pack(e.flags << 24 | e.id, e.value) for e in entries)
            flags = FLAG_CLEAR_SETTINGS if clear else 0
            parts = (FrameType.SETTINGS, flags, _U32.pack(len(entries)) + body)
        case PingFrame(ping_id):
            parts = (FrameType.PING, 0, _U32.pack(ping_id))
        case GoAwayFrame(last_stream_id, status):
            parts = (FrameType.GOAWAY, 0, _TWO_U32.pack(last_stream_id, status))
        case WindowUpdateFrame(stream_id, delta):
            parts = (FrameType.WINDOW_UPDATE, 0, _TWO_U32.pack(stream_id, delta))
        case _:
            raise TypeError(f"not a SPDY control frame: {frame!r}")
    return parts


_Decode = Callable[[int, bytes, HeaderDecoder], Frame]


def decode_control(
    frame_type: FrameType, flags: int, payload: bytes, decoder: HeaderDecoder
) -> Frame:
    """Build the frame of a known control type from its complete payload.

    Raises ProtocolError for faults that end the session and StreamError for
    faults confined to one stream.
    """
    return _DECODERS[frame_type](flags, payload, decoder)


def _fixed_length(payload: bytes, length: int, name: str) -> None:
    if len(payload) != length:
        raise ProtocolError(f"{name} frame of length {len(payload)}, expected {length}")


def _stream_id(raw: int, name: str) -> int:
    stream_id = raw & _MAX_ID
    if stream_id == 0:
        raise ProtocolError(f"{name} frame on stream 0")
    return stream_id


def _headers(decoder: HeaderDecoder, block: bytes, stream_id: int) -> Headers:
    try:
        return decoder.decode(block)
    except HeaderBlockError as exc:
        raise StreamError(str(exc), stream_id=stream_id, status=RstStatus.PROTOCOL_ERROR) from None


def _syn_stream(flags: int, payload: bytes, decoder: HeaderDecoder) -> Frame:
    if len(payload) < 10:
        raise ProtocolError(f"SYN_STREAM frame of length {len(payload)}, below 10")
    raw_id, raw_assoc, priority, slot = struct.unpack_from(">IIBB", payload)
    stream_id = _stream_id(raw_id, "SYN_STREAM")
    headers = _headers(decoder, payload[10:], stream_id)
    return SynStreamFrame(
        stream_id,
        headers,
        associated_id=raw_assoc & _MAX_ID,
        priority=priority >> 5,
        slot=slot,
        fin=bool(flags & FLAG_FIN),
        unidirectional=bool(flags & FLAG_UNIDIRECTIONAL),
    )


def _syn_reply(flags: int, payload: bytes, decoder: HeaderDecoder) -> Frame:
    stream_id, block = _id_and_block(payload, "SYN_REPLY")
    return SynReplyFrame(stream_id, _headers(decoder, block, stream_id), fin=bool(flags & FLAG_FIN))


def _headers_frame(flags: int, payload: bytes, decoder: HeaderDecoder) -> Frame:
    stream_id, block = _id_and_block(payload, "HEADERS")
    return HeadersFrame(stream_id, _headers(decoder, block, stream_id), fin=bool(flags & FLAG_FIN))


def _id_and_block(payload: bytes, name: str) -> tuple[int, bytes]:
    if len(payload) < 4:
        raise ProtocolError(f"{name} frame of length {len(payload)}, below 4")
    (raw_id,) = _U32.unpack_from(payload)
    return _stream_id(raw_id, name), payload[4:]


def _rst_stream(flags: int, payload: bytes, decoder: HeaderDecoder) -> Frame:
    _fixed_length(payload, 8, "RST_STREAM")
    raw_id, status = _TWO_U32.unpack(payload)
    if status == 0:
        raise ProtocolError("RST_STREAM with status 0")
    return RstStreamFrame(_stream_id(raw_id, "RST_STREAM"), status)


def _settings(flags: int, payload: bytes, decoder: HeaderDecoder) -> Frame:
    if len(payload) < 4:
        raise ProtocolError(f"SETTINGS frame of length {len(payload)}, below 4")
    (count,) = _U32.unpack_from(payload)
    if len(payload) != 4 + 8 * count:
        raise ProtocolError(f"SETTINGS frame of length {len(payload)} for {count} entries")
    entries = tuple(
        Setting(flag_id & 0xFFFFFF, value, flag_id >> 24)
        for flag_id, value in _TWO_U32.iter_unpack(payload[4:])
    )
    return SettingsFrame(entries, clear=bool(flags & FLAG_CLEAR_SETTINGS))


def _ping(flags: int, payload: bytes, decoder: HeaderDecoder) -> Frame:
    _fixed_length(payload, 4, "PING")
    (ping_id,) = _U32.unpack(payload)
    if ping_id == 0:
        raise ProtocolError("PING with id 0")
    return PingFrame(ping_id)


def _goaway(flags: int, payload: bytes, decoder: HeaderDecoder) -> Frame:
    _fixed_length(payload, 8, "GOAWAY")
    raw_id, status = _TWO_U32.unpack(payload)
    return GoAwayFrame(raw_id & _MAX_ID, status)


def _window_update(flags: int, payload: bytes, decoder: HeaderDecoder) -> Frame:
    _fixed_length(payload, 8, "WINDOW_UPDATE")
    raw_id, raw_delta = _TWO_U32.unpack(payload)
    return WindowUpdateFrame(raw_id & _MAX_ID, raw_delta & _MAX_ID)


_DECODERS: dict[FrameType, _Decode] = {
    FrameType.SYN_STREAM: _syn_stream,
    FrameType.SYN_REPLY: _syn_reply,
    FrameType.RST_STREAM: _rst_stream,
    FrameType.SETTINGS: _settings,
    FrameType.PING: _ping,
    FrameType.GOAWAY: _goaway,
    FrameType.HEADERS: _headers_frame,
    FrameType.WINDOW_UPDATE: _window_update,
}
