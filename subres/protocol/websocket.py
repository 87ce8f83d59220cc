"""RFC 6455 frames as a server reads and writes them, parsed where they lie.

`FrameDecoder` reads a client's frames out of the caller's receive buffer and
returns spans (offsets into that buffer) instead of bytes: the caller unmasks
each payload span once, straight into what it hands on, so no byte is copied
to be parsed. A data frame's payload is returned as it arrives, in pieces
that may end mid-frame; the decoder keeps only a frame's remaining length and
mask between calls, and tells the caller how many bytes of the buffer it has
consumed (what is left is at most an incomplete header or control frame,
`MAX_LEFTOVER` bytes, which the caller keeps for the next call).

The rules a server enforces on what it reads (RFC 6455 5.1 to 5.5): client
frames are masked; reserved bits are zero (no extension is negotiated);
opcodes are known; control frames are final and at most 125 bytes;
continuations continue a message and new messages do not interrupt one; a
message's length, fragments together, is at most `max_message`. A violation
raises `ProtocolError` carrying the close code to send. After a close frame
nothing more is read.

The encoding side is what a server sends: unmasked frame headers
(`frame_header`), close payloads (`close_payload`), and the checks on a
received close frame (`parse_close`) and text (`decode_text`).
"""

from __future__ import annotations

import enum
import struct
from typing import NamedTuple

__all__ = [
    "MAX_CONTROL",
    "MAX_LEFTOVER",
    "CloseCode",
    "ControlReceived",
    "DataReceived",
    "Event",
    "FrameDecoder",
    "Opcode",
    "ProtocolError",
    "close_payload",
    "decode_text",
    "frame_header",
    "parse_close",
    "rotate",
]

MAX_CONTROL = 125
"""The longest payload of a control frame (RFC 6455 5.5)."""
MAX_HEADER = 14
"""The longest client frame header: 2 bytes, an 8-byte length, a 4-byte mask."""
MAX_LEFTOVER = MAX_HEADER + MAX_CONTROL
"""The most bytes a decoder leaves unconsumed: a header or a control frame not yet whole."""
MAX_REASON = 123
"""A close frame's reason is at most 123 bytes (its payload at most 125)."""

_U16 = struct.Struct("!H")
_U64 = struct.Struct("!Q")


class Opcode(enum.IntEnum):
    """Frame types (RFC 6455 5.2); the others are reserved."""

    CONTINUATION = 0x0
    TEXT = 0x1
    BINARY = 0x2
    CLOSE = 0x8
    PING = 0x9
    PONG = 0xA


_DATA = (Opcode.TEXT, Opcode.BINARY)
_CONTROL = (Opcode.CLOSE, Opcode.PING, Opcode.PONG)
_KNOWN = {int(op): op for op in Opcode}


class CloseCode(enum.IntEnum):
    """Close codes subres sends or checks."""

    NORMAL = 1000
    GOING_AWAY = 1001
    PROTOCOL_ERROR = 1002
    NO_STATUS = 1005
    """Received without a code; never sent."""
    ABNORMAL = 1006
    """The connection ended without a close frame; never sent."""
    INVALID_DATA = 1007
    POLICY_VIOLATION = 1008
    MESSAGE_TOO_BIG = 1009
    INTERNAL_ERROR = 1011
    TAKEN_OVER = 4001
    FELL_BEHIND = 4002
    """An observer that read the console too slowly was cut off."""
    RECORDING_FAILED = 4003
    """The session's required recording stopped being writable (`record: required`)."""
    MAX_DURATION = 4004
    """The session reached the longest a limit lets it last (`maxSessionDuration`)."""
    IDLE = 4005
    """The session went without input for as long as a limit allows (`idleTimeout`)."""
    MODERATOR_ENDED = 4006
    """A moderator ended the moderated session."""
    MODERATOR_LEFT = 4007
    """The moderators left a session whose policy says `onLeave: terminate`."""


class ProtocolError(ValueError):
    """The client broke RFC 6455; `code` is the close code to answer with."""

    def __init__(self, code: CloseCode, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


class DataReceived(NamedTuple):
    """A piece of a data message's payload: `buffer[start:stop]`, still masked with `mask`.

    `mask` is already turned to the piece's first byte. A message is one or
    more pieces, the first with `first`, the last with `last`; an empty
    message is one empty piece with both. (Events are named tuples: several
    are made per read on the upload path, and a tuple is made in about a
    third of a frozen dataclass's time.)
    """

    opcode: Opcode
    """TEXT or BINARY: the message's type, on every piece."""
    start: int
    stop: int
    mask: bytes
    first: bool
    last: bool


class ControlReceived(NamedTuple):
    """A whole control frame: its payload is `buffer[start:stop]`, masked with `mask`."""

    opcode: Opcode
    start: int
    stop: int
    mask: bytes


Event = DataReceived | ControlReceived


def rotate(mask: bytes, offset: int) -> bytes:
    """`mask` as it applies from byte `offset` of the payload on."""
    turn = offset & 3
    return mask[turn:] + mask[:turn] if turn else mask


class FrameDecoder:
    """A client's frames, read from the buffers a server receives them in.

    Call `feed` with the unconsumed bytes of the last call followed by what
    arrived since; it returns the events and how many bytes it consumed.
    """

    __slots__ = (
        "_closed",
        "_fin",
        "_first",
        "_in_frame",
        "_mask",
        "_max",
        "_message",
        "_offset",
        "_remaining",
        "_size",
    )

    def __init__(self, *, max_message: int) -> None:
        self._max = max_message
        self._message: Opcode | None = None
        """The opcode of the data message in progress, if one is."""
        self._size = 0
        """Payload bytes of that message so far, counting the frame being read."""
        self._remaining = 0
        """Payload bytes of the current data frame still to come (0: a header is next)."""
        self._in_frame = False
        self._mask = b""
        self._offset = 0
        self._fin = False
        self._first = True
        self._closed = False

    @property
    def closed(self) -> bool:
        """A close frame was read: the decoder consumes and ignores what follows."""
        return self._closed

    def feed(self, buffer: bytes | bytearray | memoryview) -> tuple[list[Event], int]:
        """The events in `buffer`, and how many of its bytes were consumed.

        The bytes not consumed (at most `MAX_LEFTOVER`) start the next call's
        buffer. Raises `ProtocolError` at the first violation.
        """
        events: list[Event] = []
        end = len(buffer)
        pos = 0
        while pos < end and not self._closed:
            if self._in_frame:
                stop = min(end, pos + self._remaining)
                self._piece(events, pos, stop)
                pos = stop
                continue
            parsed = self._header(buffer, pos, end)
            if parsed is None:
                break
            opcode, fin, length, mask, body = parsed
            if opcode in _CONTROL:
                if end - body < length:
                    break  # a control frame is returned whole
                events.append(ControlReceived(opcode, body, body + length, mask))
                self._closed = opcode is Opcode.CLOSE
                pos = body + length
                continue
            self._start_frame(opcode, fin, length, mask)
            pos = body
            if length == 0:
                self._piece(events, pos, pos)
        if self._closed:
            return events, end
        return events, pos

    def _header(
        self, buffer: bytes | bytearray | memoryview, pos: int, end: int
    ) -> tuple[Opcode, bool, int, bytes, int] | None:
        """The next frame's opcode, FIN, length, mask and payload offset; None if incomplete."""
        if end - pos < 2:
            return None
        first, second = buffer[pos], buffer[pos + 1]
        opcode = _checked_opcode(first, second)
        fin = bool(first & 0x80)
        length = second & 0x7F
        head = pos + 2
        if opcode in _CONTROL:
            if not fin:
                raise ProtocolError(CloseCode.PROTOCOL_ERROR, "fragmented control frame")
            if length > MAX_CONTROL:
                raise ProtocolError(CloseCode.PROTOCOL_ERROR, "control frame over 125 bytes")
        elif length == 126:
            if end - head < 2:
                return None
            length = _U16.unpack_from(buffer, head)[0]
            head += 2
        elif length == 127:
            if end - head < 8:
                return None
            length = _U64.unpack_from(buffer, head)[0]
            head += 8
            if length >> 63:
                raise ProtocolError(CloseCode.PROTOCOL_ERROR, "frame length over 2^63")
        if end - head < 4:
            return None
        mask = bytes(buffer[head : head + 4])
        return opcode, fin, length, mask, head + 4

    def _start_frame(self, opcode: Opcode, fin: bool, length: int, mask: bytes) -> None:
        if opcode is Opcode.CONTINUATION:
            if self._message is None:
                raise ProtocolError(CloseCode.PROTOCOL_ERROR, "continuation without a message")
        elif self._message is not None:
            raise ProtocolError(CloseCode.PROTOCOL_ERROR, "new message inside a fragmented one")
        else:
            self._message = opcode
            self._size = 0
            self._first = True
        self._size += length
        if self._size > self._max:
            raise ProtocolError(CloseCode.MESSAGE_TOO_BIG, f"message over {self._max} bytes")
        self._remaining = length
        self._in_frame = length > 0
        self._mask = mask
        self._offset = 0
        self._fin = fin

    def _piece(self, events: list[Event], start: int, stop: int) -> None:
        taken = stop - start
        self._remaining -= taken
        last_of_frame = self._remaining == 0
        last = last_of_frame and self._fin
        assert self._message is not None
        events.append(
            DataReceived(
                self._message, start, stop, rotate(self._mask, self._offset), self._first, last
            )
        )
        self._offset += taken
        self._first = False
        if last_of_frame:
            self._in_frame = False
        if last:
            self._message = None


def _checked_opcode(first: int, second: int) -> Opcode:
    """The opcode of a header starting with these two bytes, if they follow the rules."""
    if first & 0x70:
        raise ProtocolError(CloseCode.PROTOCOL_ERROR, "reserved bits set")
    opcode = _KNOWN.get(first & 0x0F)
    if opcode is None:
        raise ProtocolError(CloseCode.PROTOCOL_ERROR, f"reserved opcode {first & 0x0F}")
    if not second & 0x80:
        raise ProtocolError(CloseCode.PROTOCOL_ERROR, "unmasked frame from a client")
    return opcode


def frame_header(opcode: Opcode, length: int, *, fin: bool = True) -> bytes:
    """The header of an unmasked (server) frame with a payload of `length` bytes."""
    first = (0x80 if fin else 0) | opcode
    if length < 126:
        return bytes((first, length))
    if length < 1 << 16:
        return bytes((first, 126)) + _U16.pack(length)
    return bytes((first, 127)) + _U64.pack(length)


def close_payload(code: int, reason: str) -> bytes:
    """A close frame's payload: `code` and `reason`, cut to 123 bytes at a character boundary."""
    data = reason.encode()[:MAX_REASON].decode("utf-8", "ignore").encode()
    return _U16.pack(code) + data


def parse_close(payload: bytes) -> tuple[int, str]:
    """The code and reason of a received close frame (1005 when it has none)."""
    if not payload:
        return CloseCode.NO_STATUS, ""
    if len(payload) == 1:
        raise ProtocolError(CloseCode.PROTOCOL_ERROR, "close frame of one byte")
    code = _U16.unpack_from(payload)[0]
    if not _valid_close_code(code):
        raise ProtocolError(CloseCode.PROTOCOL_ERROR, f"invalid close code {code}")
    return code, decode_text(payload[2:])


def _valid_close_code(code: int) -> bool:
    # RFC 6455 7.4: 1004-1006 and 1015 are reserved, 1016-2999 unassigned, 3000-4999 private.
    return code in (1000, 1001, 1002, 1003) or 1007 <= code <= 1014 or 3000 <= code <= 4999


def decode_text(data: bytes) -> str:
    """A text payload as str; 1007 if it is not UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError(CloseCode.INVALID_DATA, "text is not UTF-8") from None
