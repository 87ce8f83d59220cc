"""Display recordings: what a VNC display showed, as self-contained, checksummed, seekable blocks.

A file is a signature line, a JSON header line, then blocks:

    b"SUBRES-DISPLAY/1\\n"
    {"timestamp": 1714557723, "title": "Machine default/vm1 vnc"}\\n
    block*

    block   = head payload
    head    = "SD" flags:u8 0:u8 time:u32 length:u32 crc32:u32       (16 bytes, big-endian)
              flags bit 0: a key block, whose first record is a whole frame
              time: milliseconds since the recording started, of its first record
    payload = zlib(record*), `length` bytes, CRC-32 `crc32`

    record  = 1 time:u32 width:u16 height:u16 rgb[width*height*3]            FRAME
            | 2 time:u32 x:u16 y:u16 width:u16 height:u16 rgb[width*height*3] RECT
            | 3 time:u32 length:u16 utf8[length]                              MARK
            | 4 time:u32                                                      END

Pixels are 8-bit R, G, B, row by row. A FRAME's rows after its first are
stored XORed with the row above (a picture's rows are much alike: a
gradient that zlib cannot shrink shrinks some fifteen times); a RECT's are
stored as they are (it is small, and filtering costs the writer). A key
block holds everything needed to draw from its time on, so a player seeks
to the last key block before a moment and applies what follows; a block is
written whole or not at all, so a file cut anywhere (a killed writer)
plays up to its last whole block (`complete_size`). Keystrokes and cut
text are never in it: the recorder only watches the display.

`Writer` builds blocks (`seal` compresses, and may run in a thread),
`read_header`, `blocks` and `records` read them back, bounding what a
hostile file can make us hold, and `Screen` applies records to a
framebuffer. No I/O, no clock: times are passed in.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = [
    "MAGIC",
    "BlockRef",
    "DisplayRecordingError",
    "End",
    "Frame",
    "Header",
    "Mark",
    "Record",
    "Rect",
    "Screen",
    "Writer",
    "blocks",
    "complete_size",
    "head",
    "read_header",
    "records",
    "seal",
]

MAGIC = b"SUBRES-DISPLAY/1\n"
HEAD = struct.Struct(">2sBxIII")
"""A block's head: "SD", flags, time (ms), payload length, CRC-32 of the payload."""
BLOCK_MAGIC = b"SD"
KEY = 1
MAX_HEADER = 4096
MAX_PIXELS = 4096 * 4096
"""Largest frame a recording may hold (as the screenshot's bound)."""
MAX_BLOCK = 2 * 3 * MAX_PIXELS + (1 << 20)
"""Most bytes one block's records may decompress to: an update of the largest frame (at most
twice its pixels, as the RFB client bounds it), and markers."""
MAX_TEXT = 4096

FRAME, RECT, MARK, END = 1, 2, 3, 4
_FRAME = struct.Struct(">BIHH")
_RECT = struct.Struct(">BIHHHH")
_MARK = struct.Struct(">BIH")
_END = struct.Struct(">BI")


class DisplayRecordingError(ValueError):
    """Not a display recording, or a broken one; the message says where."""


@dataclass(frozen=True)
class Header:
    """What a recording says of itself."""

    timestamp: int
    """Its start, in Unix seconds."""
    title: str = ""

    def encode(self) -> bytes:
        """The signature and header lines."""
        body = json.dumps({"timestamp": self.timestamp, "title": self.title}, ensure_ascii=False)
        return MAGIC + body.encode() + b"\n"


@dataclass(frozen=True)
class Frame:
    """A whole framebuffer (a key block starts with one; also every resize)."""

    time: int
    width: int
    height: int
    rgb: bytes


@dataclass(frozen=True)
class Rect:
    """A rectangle of the framebuffer that changed."""

    time: int
    x: int
    y: int
    width: int
    height: int
    rgb: bytes


@dataclass(frozen=True)
class Mark:
    """A note: who attached, left or took over."""

    time: int
    text: str


@dataclass(frozen=True)
class End:
    """The recording ended here (a file without one was cut short)."""

    time: int


Record = Frame | Rect | Mark | End


@dataclass(frozen=True)
class BlockRef:
    """Where one whole block lies in a file, and what its head says."""

    offset: int
    """Of its payload."""
    length: int
    time: int
    key: bool


class Writer:
    """The records of the block being built; `take` hands them over for `seal`."""

    def __init__(self) -> None:
        self._records = bytearray()
        self._key = False
        self._time: int | None = None

    @property
    def size(self) -> int:
        """Bytes of records waiting."""
        return len(self._records)

    def frame(self, time: int, width: int, height: int, rgb: bytes | memoryview) -> None:
        """A whole frame: it starts a key block (call `take` first when records wait)."""
        assert not self._records, "a frame starts its own block"
        self._key = True
        self._start(time)
        self._records += _FRAME.pack(FRAME, time, width, height)
        self._records += rgb

    def rect(self, time: int, box: tuple[int, int, int, int], rgb: bytes) -> None:
        """A changed rectangle: `box` is its x, y, width and height."""
        self._start(time)
        self._records += _RECT.pack(RECT, time, *box)
        self._records += rgb

    def mark(self, time: int, text: str) -> None:
        """A note (cut to `MAX_TEXT` bytes)."""
        data = text.encode()[:MAX_TEXT]
        self._start(time)
        self._records += _MARK.pack(MARK, time, len(data)) + data

    def end(self, time: int) -> None:
        """The last record."""
        self._start(time)
        self._records += _END.pack(END, time)

    def _start(self, time: int) -> None:
        if self._time is None:
            self._time = time

    def take(self) -> tuple[bool, int, bytes] | None:
        """The waiting records as (key, time, records) for `seal`, or None when none wait."""
        if not self._records or self._time is None:
            return None
        taken = (self._key, self._time, bytes(self._records))
        self._records = bytearray()
        self._key = False
        self._time = None
        return taken


def seal(key: bool, time: int, data: bytes, *, level: int = 1) -> bytes:
    """One whole block of `data` (records as `Writer` gives them), compressed and checksummed.

    A frame (the first record of a key block) is filtered here, where it may
    run in a worker thread.
    """
    payload = zlib.compress(_filter_frame(data) if data[:1] == bytes([FRAME]) else data, level)
    flags = KEY if key else 0
    return HEAD.pack(BLOCK_MAGIC, flags, time, len(payload), zlib.crc32(payload)) + payload


def _filter_frame(data: bytes) -> bytes:
    """`data` with its first record, a FRAME, XORed row by row with the row above."""
    _, _, width, height = _unpack(_FRAME, data, 0)
    start = _FRAME.size
    end = start + width * height * 3
    pixels, stride = data[start:end], width * 3
    # One big-integer XOR against the same bytes a row later: row i ^ row i-1 for every row.
    above = int.from_bytes(pixels[: len(pixels) - stride], "big")
    filtered = (int.from_bytes(pixels, "big") ^ above).to_bytes(len(pixels), "big")
    return data[:start] + filtered + data[end:]


def _unfilter(pixels: bytes, stride: int) -> bytes:
    """Undo `_filter_frame`'s rows."""
    if not stride:
        return pixels
    out = bytearray(pixels[:stride])
    row = int.from_bytes(pixels[:stride], "big")
    for start in range(stride, len(pixels), stride):
        row ^= int.from_bytes(pixels[start : start + stride], "big")
        out += row.to_bytes(stride, "big")
    return bytes(out)


def read_header(data: bytes) -> tuple[Header, int]:
    """The header at the start of `data`, and the offset of the first block."""
    if not data.startswith(MAGIC):
        raise DisplayRecordingError("not a display recording (no SUBRES-DISPLAY/1 line)")
    end = data.find(b"\n", len(MAGIC), len(MAGIC) + MAX_HEADER)
    if end < 0:
        raise DisplayRecordingError("line 2: no header line")
    try:
        doc = json.loads(data[len(MAGIC) : end])
    except ValueError as exc:
        raise DisplayRecordingError(f"line 2: not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise DisplayRecordingError("line 2: the header is a JSON object")
    timestamp = doc.get("timestamp")
    if isinstance(timestamp, bool) or not isinstance(timestamp, int):
        raise DisplayRecordingError("line 2: timestamp must be a number of seconds")
    return Header(timestamp, str(doc.get("title") or "")), end + 1


def head(data: bytes) -> tuple[bool, int, int, int]:
    """A block head's (key, time, length, crc32) (`HEAD.size` bytes)."""
    magic, flags, time, length, crc = HEAD.unpack(data)
    if magic != BLOCK_MAGIC:
        raise DisplayRecordingError(f"a block starts with {magic!r}, not {BLOCK_MAGIC!r}")
    return bool(flags & KEY), time, length, crc


def blocks(data: bytes, offset: int) -> Iterator[BlockRef]:
    """The whole blocks of `data` from `offset` (its first block); stops at a torn tail."""
    while offset + HEAD.size <= len(data):
        key, time, length, crc = head(data[offset : offset + HEAD.size])
        start = offset + HEAD.size
        payload = data[start : start + length]
        if len(payload) < length or zlib.crc32(payload) != crc:
            return
        yield BlockRef(start, length, time, key)
        offset = start + length


def complete_size(data: bytes) -> int:
    """How many leading bytes of `data` form a header and whole blocks (0: no header)."""
    try:
        _, offset = read_header(data)
        for ref in blocks(data, offset):
            offset = ref.offset + ref.length
    except DisplayRecordingError:
        return 0
    return offset


def records(payload: bytes) -> Iterator[Record]:
    """The records of one block's payload, bounded in size and checked."""
    inflater = zlib.decompressobj()
    try:
        data = inflater.decompress(payload, MAX_BLOCK)
    except zlib.error as exc:
        raise DisplayRecordingError(f"a block does not decompress: {exc}") from None
    if inflater.unconsumed_tail:
        raise DisplayRecordingError(f"a block holds more than {MAX_BLOCK} bytes")
    pos = 0
    while pos < len(data):
        record, pos = _record(data, pos)
        yield record


def _record(data: bytes, pos: int) -> tuple[Record, int]:
    kind = data[pos]
    if kind == FRAME:
        _, time, width, height = _unpack(_FRAME, data, pos)
        rgb, end = _pixels(data, pos + _FRAME.size, width, height)
        return Frame(time, width, height, _unfilter(rgb, width * 3)), end
    if kind == RECT:
        _, time, x, y, width, height = _unpack(_RECT, data, pos)
        rgb, end = _pixels(data, pos + _RECT.size, width, height)
        return Rect(time, x, y, width, height, rgb), end
    if kind == MARK:
        _, time, length = _unpack(_MARK, data, pos)
        start = pos + _MARK.size
        if start + length > len(data):
            raise DisplayRecordingError("a marker runs past its block")
        return Mark(time, data[start : start + length].decode("utf-8", "replace")), start + length
    if kind == END:
        _, time = _unpack(_END, data, pos)
        return End(time), pos + _END.size
    raise DisplayRecordingError(f"unknown record type {kind}")


def _unpack(layout: struct.Struct, data: bytes, pos: int) -> tuple[int, ...]:
    if pos + layout.size > len(data):
        raise DisplayRecordingError("a record runs past its block")
    return layout.unpack_from(data, pos)


def _pixels(data: bytes, start: int, width: int, height: int) -> tuple[bytes, int]:
    if width * height > MAX_PIXELS:
        raise DisplayRecordingError(f"a {width}x{height} picture is over {MAX_PIXELS} pixels")
    end = start + width * height * 3
    if end > len(data):
        raise DisplayRecordingError("pixels run past their block")
    return data[start:end], end


class Screen:
    """A framebuffer that records are applied to, as a player draws them."""

    def __init__(self) -> None:
        self.width = 0
        self.height = 0
        self.rgb = bytearray()

    def apply(self, record: Record) -> None:
        """Draw `record` (markers and the end draw nothing)."""
        if isinstance(record, Frame):
            self.width, self.height = record.width, record.height
            self.rgb = bytearray(record.rgb)
        elif isinstance(record, Rect):
            self._rect(record)

    def _rect(self, rect: Rect) -> None:
        if rect.x + rect.width > self.width or rect.y + rect.height > self.height:
            raise DisplayRecordingError(
                f"rectangle {rect.width}x{rect.height}+{rect.x}+{rect.y} outside the "
                f"{self.width}x{self.height} screen"
            )
        row = rect.width * 3
        stride = self.width * 3
        for line in range(rect.height):
            start = (rect.y + line) * stride + rect.x * 3
            self.rgb[start : start + row] = rect.rgb[line * row : (line + 1) * row]
