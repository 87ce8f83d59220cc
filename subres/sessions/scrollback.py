"""The last bytes a kept console printed, replayed to whoever attaches.

A ring of exactly `limit` bytes, allocated when the first byte arrives:
appending past it overwrites the oldest bytes, so a kept console's
scrollback costs its limit and not a byte more, however it was written to
(a growing and trimmed buffer would keep its largest size). Replays start at
a line boundary once the oldest bytes are gone, so they never begin in the
middle of a line or an escape sequence.
"""

from __future__ import annotations

__all__ = ["Scrollback"]


class Scrollback:
    """A bounded tail of a console's output."""

    __slots__ = ("_ring", "_size", "_start", "_wrapped", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._ring = bytearray()
        self._start = 0
        """Where the oldest kept byte is."""
        self._size = 0
        self._wrapped = False
        """Bytes were overwritten: the oldest line kept may be partial."""

    def __len__(self) -> int:
        return self._size

    def append(self, data: bytes) -> None:
        """Keep `data`, overwriting the oldest bytes beyond the limit."""
        if not data:
            return
        if not self._ring:
            self._ring = bytearray(self.limit)
        if len(data) >= self.limit:
            self._ring[:] = data[-self.limit :]
            self._start, self._size = 0, self.limit
            self._wrapped = True
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
