"""One console's recording as it happens: a hub `Sink` that turns output into asciicast lines.

The hub calls it synchronously for every chunk, resize and marker; the lines
wait in memory until `drain` hands them to whoever writes files, so a slow
disk never holds a session back. What waits is bounded (`max_pending`): past
it output is dropped, and a marker says how much once writing catches up.
Output the recording's `quota` refuses (its namespace's space is full) is
dropped the same way, the marker saying why.
A recording longer than `max_file` goes on in a new file (part 2, 3, …),
each with its own header, so every file plays on its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from subres.protocol.asciicast import Encoder, Header
from subres.protocol.channels import TerminalSize

__all__ = ["DEFAULT_SIZE", "Recorder"]

DEFAULT_SIZE = TerminalSize(80, 24)
"""The terminal size a recording starts with until the writer says its own."""
MAX_PENDING = 4 << 20


class Recorder:
    """Asciicast lines of one console, waiting to be written to `path` (then its parts).

    `on_close` is told when the recording ends (its hub lets it go).
    """

    def __init__(
        self,
        path: Path,
        *,
        title: str,
        max_file: int,
        max_pending: int = MAX_PENDING,
        size: TerminalSize | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        on_close: Callable[[Recorder], None] = lambda _: None,
        quota: Callable[[int], str] | None = None,
    ) -> None:
        self.first = path
        self.path = path
        self.title = title
        self.closed = False
        self.failure = ""
        """Always empty: a console's recording fails only in its file."""
        self._on_close = on_close
        self._max_file = max_file
        self._max_pending = max_pending
        self._size = size or DEFAULT_SIZE
        self._clock, self._wall = clock, wall
        self._part = 1
        self._in_part = 0
        self._waiting = 0
        self._lost = 0
        self._lost_why = ""
        self._quota = quota
        """Asked before each output line is kept: "" yes, or why not."""
        self._pending: list[tuple[Path, bytearray]] = [(path, bytearray())]
        self._encoder = self._start()

    def _start(self) -> Encoder:
        encoder = Encoder(start=self._clock())
        header = Header(
            width=self._size.width,
            height=self._size.height,
            timestamp=int(self._wall()),
            title=self.title if self._part == 1 else f"{self.title} (part {self._part})",
            env={"TERM": "xterm-256color"},
        )
        self._add(header.encode())
        return encoder

    def _add(self, line: bytes) -> None:
        self._pending[-1][1].extend(line)
        self._in_part += len(line)
        self._waiting += len(line)

    def _roll(self) -> Encoder:
        """The encoder of the next event: a full part's comes after the next one's header."""
        if self._in_part >= self._max_file:
            self._part += 1
            self._in_part = 0
            self.path = self.first.with_suffix(f".{self._part}.cast")
            self._pending.append((self.path, bytearray()))
            self._encoder = self._start()
        return self._encoder

    def output(self, data: bytes) -> None:
        """Console output."""
        line = self._roll().output(self._clock(), data)
        why = "the disk was too slow" if self._waiting + len(line) > self._max_pending else ""
        if not why and self._quota is not None:
            why = self._quota(len(line))
        if why:
            self._lost += len(data)
            self._lost_why = why
            return
        self._add(line)

    def resized(self, size: TerminalSize) -> None:
        """The writer's terminal changed size."""
        self._size = size
        self._add(self._roll().resize(self._clock(), size.width, size.height))

    def let_go(self) -> None:
        """A recording follows its sessions, not the keeper: it goes on."""

    def marker(self, text: str) -> None:
        """A note in the recording: who attached, who left."""
        self._add(self._roll().marker(self._clock(), text))

    def close(self) -> None:
        """The recording ends: what is left of an unfinished character is written."""
        self._add(self._encoder.finish(self._clock()))
        self.closed = True
        self._on_close(self)

    def drain(self) -> list[tuple[Path, bytes]]:
        """What to append to which file now, in order."""
        if self._lost:
            lost, self._lost = self._lost, 0
            self.marker(f"{lost} bytes of output lost: {self._lost_why}")
        writes = [(path, bytes(data)) for path, data in self._pending if data]
        self._pending = [(self.path, bytearray())]
        self._waiting = 0
        return writes
