"""A kept console's output read as a log, the way `pods/log` reads a container's.

Owns the request's options (`follow`, `tailLines`, `sinceSeconds`,
`sinceTime`, `limitBytes`, `timestamps`, `previous`, `console`), parsed
strictly and bounded as kube-apiserver validates `PodLogOptions`, and the
text answered: which lines of a kept output (`Excerpt`: its bytes and when
each stretch of them arrived) an answer holds, each line optionally led by
the RFC 3339 time (nanoseconds, as kubelet writes them) at which its first
byte arrived, cut at `limitBytes`. `Stamper` does the same to output as it
arrives, for `follow`. A line is what ends with `\\n` (or the end of what is
kept); every other byte, control characters included, passes as it is.
No I/O and no clock: times are passed in, as nanoseconds since the epoch.
"""

from __future__ import annotations

import bisect
import datetime
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Excerpt", "LogOptions", "OptionError", "Stamper", "parse", "render", "stamp"]

NANOS = 1_000_000_000
_ZONE = re.compile(r"Z|[+-]\d\d:\d\d")
LAST_NS = 253_402_300_799 * NANOS
"""9999-12-31T23:59:59Z: the last time a stamp can show."""
MAX_DIGITS = 18
"""Digits an integer option may have: every value fits in 64 bits."""
TRUE = ("1", "t", "T", "TRUE", "true", "True")
FALSE = ("0", "f", "F", "FALSE", "false", "False")
"""Booleans as Go's strconv.ParseBool spells them (how kube-apiserver reads them)."""


class OptionError(ValueError):
    """An option that kube-apiserver would refuse too; the message names it."""


@dataclass(frozen=True)
class LogOptions:
    """What a `log` request asks for."""

    follow: bool = False
    """Keep the answer open and send new output as it arrives."""
    tail_lines: int | None = None
    """Only the last this many lines of what is kept."""
    since_ns: int | None = None
    """Only lines that began at or after this time (nanoseconds since the epoch)."""
    limit_bytes: int | None = None
    """At most this many bytes in the whole answer, following included."""
    timestamps: bool = False
    """Lead each line with the time its first byte arrived and a space."""
    previous: bool = False
    """The output of the connection before the last one (the console was dialed again)."""
    console: str = ""
    """Which of the machine's consoles; "" for the default one."""


def parse(query: Mapping[str, str], *, now_ns: int) -> LogOptions:
    """The options of a query string (each name's first value); `OptionError` when one is bad.

    `sinceSeconds` counts back from `now_ns`. Names that are not options are
    ignored, as kube-apiserver ignores them.
    """
    since_seconds = _integer(query, "sinceSeconds", low=1)
    since_time = query.get("sinceTime")
    if since_seconds is not None and since_time is not None:
        raise OptionError("at most one of sinceTime or sinceSeconds may be specified")
    since_ns = None
    if since_seconds is not None:
        since_ns = now_ns - since_seconds * NANOS
    elif since_time is not None:
        since_ns = _rfc3339(since_time)
    console = query.get("console", "")
    if len(console) > 63 or not all(c.isascii() and (c.isalnum() or c == "-") for c in console):
        raise OptionError(f"console must be a console's name, not {console[:64]!r}")
    return LogOptions(
        follow=_boolean(query, "follow"),
        tail_lines=_integer(query, "tailLines", low=0),
        since_ns=since_ns,
        limit_bytes=_integer(query, "limitBytes", low=1),
        timestamps=_boolean(query, "timestamps"),
        previous=_boolean(query, "previous"),
        console=console,
    )


def _boolean(query: Mapping[str, str], name: str) -> bool:
    text = query.get(name)
    if text is None or text in FALSE:
        return False
    if text in TRUE:
        return True
    raise OptionError(f"{name} must be true or false, not {text[:32]!r}")


def _integer(query: Mapping[str, str], name: str, *, low: int) -> int | None:
    text = query.get(name)
    if text is None:
        return None
    if not (text.isascii() and text.isdigit() and len(text) <= MAX_DIGITS) or int(text) < low:
        raise OptionError(f"{name} must be a whole number of at least {low}, not {text[:32]!r}")
    return int(text)


def _rfc3339(text: str) -> int:
    """`2024-05-01T10:02:03Z` (a fraction to the nanosecond and an offset allowed) in ns."""
    head, rest = text[:19], text[19:]
    digits = rest[1:].removesuffix(rest[1:].lstrip("0123456789")) if rest[:1] == "." else ""
    zone = rest[1 + len(digits) :] if rest[:1] == "." else rest
    try:
        if len(text) > 64 or head[10:11] != "T" or (rest[:1] == "." and not 0 < len(digits) <= 9):
            raise ValueError(text)
        moment = datetime.datetime.fromisoformat(head + zone)
    except ValueError:
        moment = None
    if moment is None or not _ZONE.fullmatch(zone):
        raise OptionError(f"sinceTime must be an RFC 3339 time, not {text[:64]!r}")
    return int(moment.timestamp()) * NANOS + int(digits.ljust(9, "0") or 0)


def stamp(ns: int) -> bytes:
    """`2024-05-01T10:02:03.120000000Z `: kubelet's timestamp, then the space before the line."""
    ns = min(max(ns, 0), LAST_NS)
    moment = datetime.datetime.fromtimestamp(ns // NANOS, datetime.UTC)
    return f"{moment:%Y-%m-%dT%H:%M:%S}.{ns % NANOS:09d}Z ".encode()


@dataclass(frozen=True)
class Excerpt:
    """Kept output that starts at a line's start, and when each stretch of it arrived."""

    data: bytes
    offsets: Sequence[int]
    """Where a stretch begins in `data`, ascending (bytes before the first take its time)..."""
    times: Sequence[int]
    """...and when its first byte arrived (nanoseconds); lines take their first byte's."""

    def time_at(self, position: int) -> int:
        """When the byte at `position` arrived."""
        index = bisect.bisect_right(self.offsets, position) - 1
        return self.times[max(index, 0)] if self.times else 0


def render(excerpt: Excerpt, options: LogOptions) -> bytes:
    """The answer to `options` (all but `follow`) from `excerpt`."""
    starts = _line_starts(excerpt.data)
    if options.since_ns is not None:
        since = options.since_ns
        starts = [s for s in starts if excerpt.time_at(s) >= since]
    if options.tail_lines is not None:
        starts = starts[max(0, len(starts) - options.tail_lines) :] if options.tail_lines else []
    data = excerpt.data
    if not starts:
        return b""
    if options.timestamps:
        # Lines after the first are whole: from their start to the next line's.
        ends = [*starts[1:], len(data)]
        text = b"".join(
            stamp(excerpt.time_at(start)) + data[start:end]
            for start, end in zip(starts, ends, strict=True)
        )
    else:
        text = data[starts[0] :]
    return text if options.limit_bytes is None else text[: options.limit_bytes]


def _line_starts(data: bytes) -> list[int]:
    starts = [0] if data else []
    at = data.find(b"\n")
    while at != -1 and at + 1 < len(data):
        starts.append(at + 1)
        at = data.find(b"\n", at + 1)
    return starts


class Stamper:
    """Output as it arrives, turned into a log's text: stamped lines, cut at a byte limit."""

    __slots__ = ("_at_line_start", "_left", "_timestamps")

    def __init__(self, options: LogOptions, *, sent: int = 0, line_start: bool = True) -> None:
        """`sent`: bytes of the answer already sent; `line_start`: whether they ended a line."""
        self._timestamps = options.timestamps
        self._left = None if options.limit_bytes is None else options.limit_bytes - sent
        self._at_line_start = line_start

    @property
    def done(self) -> bool:
        """The byte limit is reached: nothing more may be sent."""
        return self._left is not None and self._left <= 0

    def feed(self, chunk: bytes, at_ns: int) -> bytes:
        """What to send for `chunk`, which arrived at `at_ns`."""
        if not chunk or self.done:
            return b""
        out = chunk
        if self._timestamps:
            mark, pieces = stamp(at_ns), []
            for line in _lines(chunk):
                if self._at_line_start:
                    pieces.append(mark)
                pieces.append(line)
                self._at_line_start = line.endswith(b"\n")
            out = b"".join(pieces)
        self._at_line_start = chunk.endswith(b"\n")
        if self._left is not None:
            out = out[: self._left]
            self._left -= len(out)
        return out


def _lines(chunk: bytes) -> list[bytes]:
    """`chunk` cut after each `\n` (only there: a `\r` is a byte like any other)."""
    pieces = [line + b"\n" for line in chunk.split(b"\n")]
    pieces[-1] = pieces[-1][:-1]
    return [piece for piece in pieces if piece]
