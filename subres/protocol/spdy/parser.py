"""Incremental reading of SPDY/3.1 frames from a byte stream.

`FrameParser` takes bytes in chunks of any size and hands out complete frames.
It holds at most one partial frame: a control frame up to
`Limits.max_control_frame_length`, a DATA frame up to `Limits.max_buffered_data`.
A longer DATA frame comes out in pieces as its bytes arrive (FIN only on the
last piece), so no peer can make it buffer a 16 MiB frame. Control frames of
unknown types are skipped without being buffered, as the spec asks.

A DATA payload is never copied: it is a memoryview of the chunk it arrived
in, and a frame that two chunks share comes out as two pieces.
"""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass

from subres.protocol.spdy.errors import ProtocolError, StreamError
from subres.protocol.spdy.frames import (
    FLAG_FIN,
    HEADER_LENGTH,
    VERSION,
    DataFrame,
    Frame,
    FrameType,
    decode_control,
)
from subres.protocol.spdy.headers import HeaderDecoder
from subres.protocol.spdy.limits import Limits
from subres.protocol.spdy.status import RstStatus

__all__ = ["FrameParser"]

_HEADER = struct.Struct(">II")
_KNOWN_TYPES = frozenset(FrameType)


@dataclass(slots=True)
class _Piece:
    """A long DATA frame being handed out as its bytes arrive."""

    stream_id: int
    remaining: int
    fin: bool


class _Input:
    """Received bytes kept as the chunks they came in.

    A frame is cut out with one copy of its own bytes (none when it is a
    whole chunk), however the chunks fell: appending a chunk to a buffer of
    leftovers would copy every byte again, and most chunks end mid-frame.
    """

    __slots__ = ("_chunks", "_pos", "size")

    def __init__(self) -> None:
        self._chunks: deque[bytes] = deque()
        self._pos = 0
        """Where the first chunk's unread bytes start."""
        self.size = 0
        """Unread bytes in all."""

    def feed(self, data: bytes) -> None:
        if data:
            self._chunks.append(data if type(data) is bytes else bytes(data))
            self.size += len(data)

    def clear(self) -> None:
        self._chunks.clear()
        self._pos = self.size = 0

    def header(self) -> tuple[int, ...]:
        """The two words of the next frame header (at least 8 bytes are there)."""
        first = self._chunks[0]
        if len(first) - self._pos >= HEADER_LENGTH:
            return _HEADER.unpack_from(first, self._pos)
        return _HEADER.unpack(b"".join(self._views(HEADER_LENGTH)))

    def take(self, count: int) -> bytes:
        """The next `count` bytes (that many are there)."""
        if not count:
            return b""
        first, pos = self._chunks[0], self._pos
        if count <= len(first) - pos:
            out = first if pos == 0 and count == len(first) else first[pos : pos + count]
            self.skip(count)
            return out
        out = b"".join(self._views(count))
        self.skip(count)
        return out

    def view(self, count: int) -> memoryview:
        """The next bytes, at most `count` and at most to the end of the first chunk."""
        first, pos = self._chunks[0], self._pos
        count = min(count, len(first) - pos)
        out = memoryview(first)[pos : pos + count]
        self.skip(count)
        return out

    @property
    def contiguous(self) -> int:
        """Unread bytes in the first chunk."""
        return len(self._chunks[0]) - self._pos if self._chunks else 0

    def skip(self, count: int) -> None:
        """Drop the next `count` bytes (at most `size`)."""
        self.size -= count
        count += self._pos
        chunks = self._chunks
        while chunks and count >= len(chunks[0]):
            count -= len(chunks.popleft())
        self._pos = count

    def _views(self, count: int) -> list[memoryview]:
        views, pos = [], self._pos
        for chunk in self._chunks:
            piece = memoryview(chunk)[pos : pos + count]
            views.append(piece)
            count -= len(piece)
            pos = 0
            if not count:
                break
        return views


class FrameParser:
    """Turns the inbound byte stream of one session into frames.

    Call `feed` with bytes as they arrive, then `next_frame` until it returns
    None. `next_frame` raises StreamError for a fault confined to one stream
    (that frame is dropped and parsing goes on) and ProtocolError for a fault
    that ends the session (every later call raises it again).
    """

    def __init__(self, decoder: HeaderDecoder, limits: Limits) -> None:
        self._decoder = decoder
        self._limits = limits
        self._input = _Input()
        self._skip = 0
        self._piece: _Piece | None = None
        self._failure: ProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet handed out as frames."""
        return self._input.size

    def feed(self, data: bytes) -> None:
        """Append received bytes."""
        if self._failure is None:
            self._input.feed(data)

    def next_frame(self) -> Frame | None:
        """Return the next complete frame, or None until more bytes arrive."""
        if self._failure is not None:
            raise self._failure
        # Each pass consumes at least a frame header or returns, so the loop
        # ends within len(buffer) / 8 passes.
        while True:
            self._discard_skipped()
            if self._skip:
                return None
            if self._piece is not None:
                return self._next_piece(self._piece)
            if self.buffered < HEADER_LENGTH:
                return None
            first, flags_length = self._input.header()
            flags, length = flags_length >> 24, flags_length & 0xFFFFFF
            if first & 0x80000000:
                if self._is_ignored_control(first, length):
                    continue
                return self._control(first & 0xFFFF, flags, length)
            return self._data(first & 0x7FFFFFFF, flags, length)

    def _fail(self, message: str) -> ProtocolError:
        self._failure = ProtocolError(message)
        self._input.clear()
        return self._failure

    def _discard_skipped(self) -> None:
        if self._skip:
            count = min(self._skip, self.buffered)
            self._input.skip(count)
            self._skip -= count

    def _is_ignored_control(self, first: int, length: int) -> bool:
        version, frame_type = (first >> 16) & 0x7FFF, first & 0xFFFF
        if version != VERSION:
            raise self._fail(f"control frame of SPDY version {version}")
        if frame_type in _KNOWN_TYPES:
            return False
        self._input.skip(HEADER_LENGTH)
        self._skip = length
        return True

    def _control(self, frame_type: int, flags: int, length: int) -> Frame | None:
        if length > self._limits.max_control_frame_length:
            raise self._fail(f"control frame of {length} bytes, over the limit")
        if self.buffered < HEADER_LENGTH + length:
            return None
        self._input.skip(HEADER_LENGTH)
        payload = self._input.take(length)
        try:
            return decode_control(FrameType(frame_type), flags, payload, self._decoder)
        except ProtocolError as exc:
            raise self._fail(str(exc)) from None

    def _data(self, stream_id: int, flags: int, length: int) -> Frame | None:
        if stream_id == 0:
            raise self._fail("DATA frame on stream 0")
        fin = bool(flags & FLAG_FIN)
        if length > self._limits.max_data_frame_length:
            self._input.skip(HEADER_LENGTH)
            self._skip = length
            raise StreamError(
                f"DATA frame of {length} bytes, over the limit",
                stream_id=stream_id,
                status=RstStatus.FRAME_TOO_LARGE,
            )
        if length > self._limits.max_buffered_data:
            self._input.skip(HEADER_LENGTH)
            self._piece = _Piece(stream_id, length, fin)
            return self._next_piece(self._piece)
        if self.buffered < HEADER_LENGTH + length:
            return None
        self._input.skip(HEADER_LENGTH)
        if not length:
            return DataFrame(stream_id, b"", fin)
        if self._input.contiguous < length:
            # Spread over two chunks: out in pieces rather than joined.
            self._piece = _Piece(stream_id, length, fin)
            return self._next_piece(self._piece)
        return DataFrame(stream_id, self._input.view(length), fin)

    def _next_piece(self, piece: _Piece) -> Frame | None:
        if not self.buffered:
            return None
        data = self._input.view(piece.remaining)
        piece.remaining -= len(data)
        if piece.remaining == 0:
            self._piece = None
        return DataFrame(piece.stream_id, data, piece.fin and piece.remaining == 0)
