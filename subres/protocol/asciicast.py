"""asciicast v2, the asciinema recording format: one JSON header line, then one line per event.

The header says the terminal's size, the recording's start (Unix seconds)
and title; each event is `[seconds since the start, code, data]` with code
`o` (output), `r` (resize, "COLSxROWS") or `m` (marker, a label). Output is
text: `Encoder.output` decodes a console's bytes as UTF-8 across chunk
boundaries (a character split between two reads is written once, whole)
and replaces what is not UTF-8.

`read` parses a recording back, bounding what a hostile file can make us
hold. No I/O, no clock: times are passed in.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Encoder", "Event", "Header", "RecordingError", "read"]

VERSION = 2
CODES = frozenset({"o", "i", "r", "m"})
MAX_LINE = 4 << 20
"""Longest line `read` accepts."""


class RecordingError(ValueError):
    """Not an asciicast v2 recording, or a broken one; the message says where."""


@dataclass(frozen=True)
class Header:
    """The first line of a recording."""

    # (A plain record: only its shape resembles other dataclasses' field lists.)

    width: int
    height: int
    timestamp: int
    """Start, in Unix seconds."""
    title: str = ""
    env: dict[str, str] = field(default_factory=dict)

    def encode(self) -> bytes:
        """The header line."""
        body: dict[str, Any] = {
            "version": VERSION,
            "width": self.width,
            "height": self.height,
            "timestamp": self.timestamp,
        }
        if self.title:
            body["title"] = self.title
        if self.env:
            body["env"] = self.env
        return _line(body)


@dataclass(frozen=True)
class Event:
    """One event: when (seconds since the start), what kind, and its data."""

    # (A plain record, as `Header` is.)

    time: float
    code: str
    data: str


class Encoder:
    """Lines of one recording, from the bytes and sizes of a live console."""

    def __init__(self, *, start: float) -> None:
        self.start = start
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._last = 0.0

    def _event(self, now: float, code: str, data: str) -> bytes:
        # Times never go back, whatever the clock did.
        self._last = max(self._last, round(now - self.start, 6))
        return _line([self._last, code, data])

    def output(self, now: float, data: bytes) -> bytes:
        """An output event (b"" while `data` ends inside a character)."""
        text = self._decoder.decode(data)
        return self._event(now, "o", text) if text else b""

    def finish(self, now: float) -> bytes:
        """An output event for a character left unfinished at the end (b"" when none)."""
        text = self._decoder.decode(b"", final=True)
        return self._event(now, "o", text) if text else b""

    def resize(self, now: float, width: int, height: int) -> bytes:
        """A resize event."""
        return self._event(now, "r", f"{width}x{height}")

    def marker(self, now: float, label: str) -> bytes:
        """A marker event."""
        return self._event(now, "m", label)


def read(lines: Iterable[bytes]) -> tuple[Header, Iterator[Event]]:
    """The header of a recording and its events (read lazily; errors raise `RecordingError`)."""
    it = iter(lines)
    first = next(it, b"")
    header = _header(_decode(first, 1))
    return header, _events(it)


def _events(lines: Iterator[bytes]) -> Iterator[Event]:
    for number, line in enumerate(lines, start=2):
        if not line.strip():
            continue
        item = _decode(line, number)
        if not isinstance(item, list) or len(item) != 3:
            raise RecordingError(f"line {number}: an event is [time, code, data]")
        when, code, data = item
        if isinstance(when, bool) or not isinstance(when, int | float) or when < 0:
            raise RecordingError(f"line {number}: the time must be a number of seconds")
        if code not in CODES or not isinstance(data, str):
            raise RecordingError(f"line {number}: unknown event {code!r}")
        yield Event(float(when), code, data)


def _header(doc: Any) -> Header:
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        raise RecordingError("line 1: not an asciicast v2 header")
    width, height = _dimension(doc.get("width")), _dimension(doc.get("height"))
    env = doc.get("env") or {}
    return Header(
        width=width,
        height=height,
        timestamp=_timestamp(doc.get("timestamp")),
        title=str(doc.get("title") or ""),
        env={str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {},
    )


def _timestamp(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1e12:
        raise RecordingError("line 1: the timestamp must be seconds since the epoch")
    return int(value)


def _dimension(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 10000:
        raise RecordingError("line 1: width and height must be positive integers")
    return value


def _decode(line: bytes, number: int) -> Any:
    if len(line) > MAX_LINE:
        raise RecordingError(f"line {number}: longer than {MAX_LINE} bytes")
    try:
        return json.loads(line)
    except ValueError as exc:
        raise RecordingError(f"line {number}: not JSON: {exc}") from None


def _line(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": ")).encode() + b"\n"
