"""SPDY/3 header blocks: the name/value layout and its per-direction zlib streams.

A block is a u32 count of names, then for each name a u32 length and the
lowercase name, a u32 length and the value; several values of one name are
joined by NUL. Each direction of a session compresses all of its blocks with
ONE zlib stream primed with the SPDY/3 dictionary and sync-flushed after each
block, so a `HeaderEncoder` and a `HeaderDecoder` live as long as the session.

Headers are tuples of ``(name, value)`` str pairs; a name with several values
appears once per value, next to each other. Bytes that are not UTF-8 survive
the round trip as surrogate escapes.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable, Mapping

from subres.protocol.spdy.dictionary import SPDY3_DICTIONARY
from subres.protocol.spdy.errors import HeaderBlockError, ProtocolError

__all__ = [
    "HeaderDecoder",
    "HeaderEncoder",
    "Headers",
    "HeadersLike",
    "normalize_headers",
    "pack_block",
    "unpack_block",
]

Headers = tuple[tuple[str, str], ...]
"""Header pairs in wire order; repeated names hold the values of a multi-value."""

HeadersLike = Mapping[str, str] | Iterable[tuple[str, str]]
"""What commands accept as headers: a mapping or an iterable of pairs."""

_U32 = struct.Struct(">I")
_ENCODING = "utf-8"
_ERRORS = "surrogateescape"


def normalize_headers(headers: HeadersLike) -> Headers:
    """Return `headers` as a tuple of pairs, checked for what a peer accepts.

    Raises ValueError for an empty or non-lowercase name, a NUL in a name or a
    value (NUL separates values on the wire), or values of one name that are
    not next to each other (the wire cannot keep that order).
    """
    pairs = tuple(headers.items()) if isinstance(headers, Mapping) else tuple(headers)
    seen: set[str] = set()
    previous = None
    for name, value in pairs:
        _check_name(name)
        if "\0" in value:
            raise ValueError(f"header {name!r} has a NUL in its value")
        if name != previous and name in seen:
            raise ValueError(f"values of header {name!r} are not adjacent")
        seen.add(name)
        previous = name
    return pairs


def _check_name(name: str) -> None:
    if not name:
        raise ValueError("empty header name")
    if name != name.lower() or "\0" in name:
        raise ValueError(f"header name {name!r} must be lowercase without NUL")


def pack_block(headers: Headers) -> bytes:
    """Lay out (uncompressed) the block of already normalized `headers`."""
    grouped: dict[str, list[str]] = {}
    for name, value in headers:
        grouped.setdefault(name, []).append(value)
    parts = [_U32.pack(len(grouped))]
    for name, values in grouped.items():
        for field in (name, "\0".join(values)):
            raw = field.encode(_ENCODING, _ERRORS)
            parts += (_U32.pack(len(raw)), raw)
    return b"".join(parts)


def unpack_block(block: bytes, *, max_count: int) -> Headers:
    """Read an uncompressed block; raise HeaderBlockError when it is malformed."""
    reader = _Reader(block)
    count = reader.u32()
    if count > max_count:
        raise HeaderBlockError(f"{count} headers, more than the limit of {max_count}")
    pairs: list[tuple[str, str]] = []
    seen: set[str] = set()
    for _ in range(count):
        name = reader.field().decode(_ENCODING, _ERRORS)
        value = reader.field().decode(_ENCODING, _ERRORS)
        _check_received_name(name, seen)
        pairs += ((name, part) for part in value.split("\0"))
    if not reader.at_end():
        raise HeaderBlockError("bytes after the last header")
    return tuple(pairs)


def _check_received_name(name: str, seen: set[str]) -> None:
    try:
        _check_name(name)
    except ValueError as exc:
        raise HeaderBlockError(str(exc)) from None
    if name in seen:
        raise HeaderBlockError(f"duplicate header name {name!r}")
    seen.add(name)


class _Reader:
    """Bounds-checked reads of u32-length fields from one block."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    def u32(self) -> int:
        if self._pos + 4 > len(self._data):
            raise HeaderBlockError("header block truncated")
        (value,) = _U32.unpack_from(self._data, self._pos)
        self._pos += 4
        return int(value)

    def field(self) -> bytes:
        length = self.u32()
        end = self._pos + length
        if end > len(self._data):
            raise HeaderBlockError("header length runs past the block")
        raw = self._data[self._pos : end]
        self._pos = end
        return raw

    def at_end(self) -> bool:
        return self._pos == len(self._data)


class HeaderEncoder:
    """The compressing zlib stream of one direction of one session."""

    def __init__(self) -> None:
        self._zlib = zlib.compressobj(9, zlib.DEFLATED, 15, 9, zdict=SPDY3_DICTIONARY)

    def encode(self, headers: HeadersLike) -> bytes:
        """Return the compressed block of `headers`, ended with a sync flush."""
        return self.compress(pack_block(normalize_headers(headers)))

    def compress(self, block: bytes) -> bytes:
        """Compress an already laid out block; unchecked, so tests can forge one."""
        return self._zlib.compress(block) + self._zlib.flush(zlib.Z_SYNC_FLUSH)


class HeaderDecoder:
    """The decompressing zlib stream of one direction of one session.

    A block that does not decompress, or would decompress to more than
    `max_block_size` bytes, leaves the stream out of step with the peer's, so
    it raises ProtocolError; a block that decompresses but is malformed raises
    HeaderBlockError.
    """

    def __init__(self, *, max_block_size: int, max_count: int) -> None:
        self._zlib = zlib.decompressobj(zdict=SPDY3_DICTIONARY)
        self._max_block_size = max_block_size
        self._max_count = max_count

    def decode(self, compressed: bytes) -> Headers:
        """Decompress one block and return its headers."""
        return unpack_block(self._inflate(compressed), max_count=self._max_count)

    def _inflate(self, compressed: bytes) -> bytes:
        try:
            block = self._zlib.decompress(compressed, self._max_block_size + 1)
        except zlib.error as exc:
            raise ProtocolError(f"header block does not decompress: {exc}") from None
        if len(block) > self._max_block_size or self._zlib.unconsumed_tail:
            raise ProtocolError(f"header block over {self._max_block_size} bytes")
        if self._zlib.eof:
            raise ProtocolError("peer ended its header compression stream")
        return block
