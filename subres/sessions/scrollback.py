"""The last bytes a kept console printed, replayed to whoever attaches and read as its log.

A ring of exactly `limit` bytes, allocated when the first byte arrives:
appending past it overwrites the oldest bytes, so a kept console's
scrollback costs its limit and not a byte more, however it was written to
(a growing and trimmed buffer would keep its largest size). Replays start at
a line boundary once the oldest bytes are gone, so they never begin in the
middle of a line or an escape sequence.

For `log`, the scrollback also knows when each line began (the keeper's
clock when its first byte arrived: one mark per chunk that starts a line, at
most `limit // 64` of them, the oldest dropped first) and where the current
and the previous connection of the console began (`connected`), so that
`excerpt` can answer a log of either.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable

from subres.protocol.consolelog import Excerpt

__all__ = ["Scrollback"]

MARK_BYTES = 64
"""Kept bytes per line-start mark at most: the marks cost a quarter of the ring at worst."""


class Scrollback:
    """A bounded tail of a console's output, with when its lines began."""

    __slots__ = (
        "_at",
        "_clock",
        "_epochs",
        "_head",
        "_line_open",
        "_ns",
        "_ring",
        "_size",
        "_start",
        "_total",
        "_wrapped",
        "limit",
    )

    def __init__(self, limit: int, *, clock: Callable[[], int] = time.time_ns) -> None:
        self.limit = limit
        self._ring = bytearray()
        self._start = 0
        """Where the oldest kept byte is."""
        self._size = 0
        self._wrapped = False
        """Bytes were overwritten: the oldest line kept may be partial."""
        self._clock = clock
        self._total = 0
        """Bytes ever appended: the position after the newest (positions count from the first)."""
        self._at = array("q")
        """Positions where a line began in a chunk..."""
        self._ns = array("q")
        """...and when that chunk arrived; both from `_head` on."""
        self._head = 0
        self._line_open = False
        """The last byte appended ended no line."""
        self._epochs: tuple[int | None, int | None] = (None, None)
        """Where the previous and the current connection's output began."""

    def __len__(self) -> int:
        return self._size

    def connected(self) -> None:
        """The console was dialed (again): its output from here on is a new connection's."""
        self._epochs = (self._epochs[1], self._total)
        self._line_open = False

    def append(self, data: bytes) -> None:
        """Keep `data`, overwriting the oldest bytes beyond the limit."""
        if not data:
            return
        self._mark(data)
        self._total += len(data)
        if not self._ring:
            self._ring = bytearray(self.limit)
        if len(data) >= self.limit:
            # Bytes are dropped unless `data` fills an empty ring exactly.
            self._wrapped = self._wrapped or self._size > 0 or len(data) > self.limit
            self._ring[:] = data[-self.limit :]
            self._start, self._size = 0, self.limit
            return
        end = (self._start + self._size) % self.limit
        first = min(len(data), self.limit - end)
        self._ring[end : end + first] = data[:first]
        self._ring[: len(data) - first] = data[first:]
        overflow = self._size + len(data) - self.limit
        if overflow > 0:
            self._start = (self._start + overflow) % self.limit
            self._size = self.limit
            self._wrapped = True
        else:
            self._size += len(data)

    def tail(self, lines: int | None = None) -> bytes:
        """What is kept, or only its last `lines` lines (a line not ended yet counts)."""
        data = self._contents()
        start = 0
        if self._wrapped:
            first = data.find(b"\n")
            start = first + 1 if first >= 0 else 0
        if lines is not None:
            if lines <= 0:
                return b""
            pos = len(data) - 1 if data.endswith(b"\n") else len(data)
            for _ in range(lines):
                pos = data.rfind(b"\n", start, pos)
                if pos < 0:
                    break
            start = max(start, pos + 1)
        return data[start:]

    def _contents(self) -> bytes:
        end = self._start + self._size
        if end <= self.limit:
            return bytes(self._ring[self._start : end])
        return bytes(self._ring[self._start :]) + bytes(self._ring[: end - self.limit])

    def _mark(self, data: bytes) -> None:
        """Note when the first line that begins in `data` began, if one does."""
        begins = 0
        if self._line_open:
            newline = data.find(b"\n")
            begins = newline + 1 if 0 <= newline < len(data) - 1 else -1
        self._line_open = not data.endswith(b"\n")
        if begins < 0:
            return
        self._at.append(self._total + begins)
        self._ns.append(self._clock())
        oldest = self._total + len(data) - self.limit
        # A mark stays while it is the one in effect at the oldest kept byte, or later.
        while self._head + 1 < len(self._at) and self._at[self._head + 1] <= oldest:
            self._head += 1
        if len(self._at) - self._head > max(1, self.limit // MARK_BYTES):
            self._head += 1
        if self._head > 64 and self._head * 2 > len(self._at):
            del self._at[: self._head], self._ns[: self._head]
            self._head = 0

    def excerpt(self, *, previous: bool = False) -> Excerpt | None:
        """The current connection's output that is kept, or the previous one's (None: the
        console has had no previous connection), from a line's start, with its marks."""
        before, current = self._epochs
        oldest = self._total - self._size
        if previous:
            if before is None or current is None:
                return None
            begin, end = before, current
        else:
            begin, end = current or 0, self._total
        start = max(begin, oldest)
        data = self._contents()[start - oldest : max(start, end) - oldest]
        if start > begin:
            # The connection's first bytes are gone: leave out the partial line that remains.
            cut = data.find(b"\n") + 1
            data, start = data[cut:] if cut else b"", start + cut if cut else end
        return self._marked(data, start)

    def _marked(self, data: bytes, start: int) -> Excerpt:
        offsets, times = [], []
        for index in range(self._head, len(self._at)):
            at = self._at[index] - start
            if at >= len(data):
                break
            if at <= 0:
                offsets, times = [0], [self._ns[index]]
            else:
                offsets.append(at)
                times.append(self._ns[index])
        return Excerpt(data, offsets, times)
