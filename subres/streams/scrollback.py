"""The last bytes a kept console printed, replayed to whoever attaches.

One `bytearray` holds at most `limit` bytes: appending past it drops the
oldest bytes (CPython deletes from a bytearray's front without copying the
rest), so a kept console costs its limit plus a small constant, however it
was written to. Replays start at a line boundary once the oldest bytes are
gone, so they never begin in the middle of a line or an escape sequence.
"""

from __future__ import annotations

__all__ = ["Scrollback"]


class Scrollback:
    """A bounded tail of a console's output."""

    __slots__ = ("_buffer", "_dropped", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._buffer = bytearray()
        self._dropped = False

    def __len__(self) -> int:
        return len(self._buffer)

    def append(self, data: bytes) -> None:
        """Keep `data`, dropping the oldest bytes beyond the limit."""
        if len(data) >= self.limit:
            self._buffer[:] = data[-self.limit :]
            self._dropped = True
            return
        self._buffer += data
        excess = len(self._buffer) - self.limit
        if excess > 0:
            del self._buffer[:excess]
            self._dropped = True

    def tail(self, lines: int | None = None) -> bytes:
        """What is kept, or only its last `lines` lines (a line not ended yet counts)."""
        data = self._buffer
        start = 0
        if self._dropped:
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
        return bytes(data[start:])
