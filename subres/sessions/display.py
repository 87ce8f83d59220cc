"""A display's recording: its own view-only connection to the VNC server, written as blocks.

The recorder watches the display itself rather than reading the viewers'
streams: a viewer's stream is in whatever encodings that viewer asked for
(Tight, ZRLE…, whose compression state spans the whole connection), starts
wherever it joined and stops with it, while a connection of our own is in
one format we chose (Raw, 32-bit true colour), survives takeovers, and
costs the interactive viewer nothing on its own path: nothing is parsed or
copied between it and the display. It also can never carry keystrokes or
cut text: it sends none and keeps none of the server's.

Its cost is bounded by asking for updates at most `rate` times a second and
no sooner than its own processing time allows for `BUDGET` of a core: a
screen that changes all the time is recorded less often, never at more CPU.
Updates become `protocol.displayrec` records; a whole frame starts a key
block when an update covers the whole screen anyway, or when what changed
since the last key block takes `KEY_RATIO` times its size, so that a seek
never replays more than that and key frames take at most a third of the
file. Records are
sealed into blocks every `SEAL_INTERVAL` (compressed in a worker thread)
for the recordings' writer to take (`drain`), so that a SIGKILL loses at
most a second. A file past `max_file` goes on in `…-ID.2.display`, which
starts with its own header and key frame and plays alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from subres.engine.stream import ByteStream
from subres.protocol import displayrec, rfb
from subres.protocol.rfbwatch import Changed, Event, FrameReady, ServerInitialised, WatchClient

__all__ = ["BUDGET", "DisplayRecorder", "DisplayUnavailable", "complete_blocks"]

log = logging.getLogger(__name__)

BUDGET = 0.05
"""Share of a core the recorder's own work may take (the wait between updates grows past it)."""
KEY_RATIO = 2
"""A key frame once the blocks since the last one take this many times its size."""
SEAL_INTERVAL = 0.2
"""Seconds records wait before they are sealed into a block."""


class DisplayUnavailable(Exception):
    """The display cannot be watched; the message says why."""


class DisplayRecorder:
    """One display's recording, from its own connection; a `recordings.Recording`."""

    def __init__(
        self,
        path: Path,
        *,
        title: str,
        max_file: int,
        rate: float,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        quota: Callable[[int], str] | None = None,
    ) -> None:
        self.first = path
        self.failure = ""
        """Why the recording stopped, once it did (the display went away)."""
        self._path = path
        self._title = title
        self._max_file = max_file
        self._interval = 1 / rate
        self._clock = clock
        self._start = clock()
        self._header = displayrec.Header(int(wall()), title).encode()
        self._sealed: list[tuple[Path, bytes]] = [(path, self._header)]
        self._in_part = len(self._header)
        self._part = 1
        self._client = WatchClient()
        self._writer = displayrec.Writer()
        self._queue: list[tuple[Path, tuple[bool, int, bytes]]] = []
        self._key_bytes = 0
        """The last key block's size, once sealed."""
        self._since_key = 0
        """Bytes of the blocks sealed after it."""
        self._cost = 0.0
        self._quota = quota
        """Asked before each block is kept: "" yes, or why not (its namespace is full)."""
        self._lost = 0
        self._lost_why = ""
        self._stream: ByteStream | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False

    @property
    def path(self) -> Path:
        """The file (part) being written now."""
        return self._path

    def _now(self) -> int:
        return int((self._clock() - self._start) * 1000)

    async def begin(self, stream: ByteStream, *, deadline: float) -> None:
        """Watch the display on `stream` (closed with the recording); raises
        `DisplayUnavailable` when no ServerInit arrives within `deadline` seconds."""
        self._stream = stream
        events: list[Event] = []
        try:
            async with asyncio.timeout(deadline):
                while not any(isinstance(e, ServerInitialised) for e in events):
                    events += await self._exchange()
        except TimeoutError:
            raise DisplayUnavailable(f"the display said nothing in {deadline:g}s") from None
        except (rfb.RfbError, OSError) as exc:
            raise DisplayUnavailable(f"cannot watch the display: {exc}") from None
        self._handle(events)
        self._tasks = [
            asyncio.create_task(self._watch(), name=f"watch {self.first.name}"),
            asyncio.create_task(self._seal_often(), name=f"seal {self.first.name}"),
        ]

    async def _exchange(self) -> list[Event]:
        """Send what waits, read once, and parse it (the time it took counts as cost)."""
        assert self._stream is not None
        if out := self._client.data_to_send():
            await self._stream.write(out)
        data = await self._stream.read()
        if not data:
            raise ConnectionResetError("the display closed the connection")
        started = time.perf_counter()
        events = self._client.receive_data(data)
        self._cost += time.perf_counter() - started
        return events

    async def _watch(self) -> None:
        asked = self._clock()
        try:
            while True:
                events = await self._exchange()
                if not self._handle(events):
                    continue
                # The next update no sooner than the rate allows, nor than the budget does.
                wait = max(self._interval - (self._clock() - asked), self._cost / BUDGET)
                self._cost = 0.0
                await asyncio.sleep(wait)
                asked = self._clock()
                self._client.request()
        except (rfb.RfbError, OSError) as exc:
            self.failure = f"the recording lost the display: {exc}"
            log.warning("%s: %s", self.first, self.failure)

    def _handle(self, events: list[Event]) -> bool:
        """Record what `events` say; True once an update finished."""
        finished = False
        for event in events:
            if isinstance(event, FrameReady):
                self._key()
                finished = True
            elif isinstance(event, Changed):
                self._changes(event)
                finished = True
        return finished

    def _changes(self, changed: Changed) -> None:
        width, height = self._client.size
        whole = any(w == width and h == height for _, _, w, h in changed.rects)
        if whole or self._lost or self._since_key >= KEY_RATIO * self._key_bytes > 0:
            self._key()
            return
        now = self._now()
        for x, y, w, h in changed.rects:
            if w and h:
                self._writer.rect(now, (x, y, w, h), self._client.pixels(x, y, w, h))
        # One update a block at most, so that a block stays within what a reader accepts.
        self._take()

    def _key(self) -> None:
        """A whole frame, starting a key block."""
        self._take()
        width, height = self._client.size
        self._writer.frame(self._now(), width, height, bytes(self._client.framebuffer))
        self._take()
        self._key_bytes = 0  # until it is sealed
        self._since_key = 0

    def _take(self) -> None:
        taken = self._writer.take()
        if taken is not None:
            self._queue.append((self._path, taken))

    async def _seal_often(self) -> None:
        while True:
            await asyncio.sleep(SEAL_INTERVAL)  # a cadence, not a synchronisation
            self._roll()
            self._take()
            if self._queue:
                # Left queued until sealed: a `close` meanwhile seals them itself.
                queue = list(self._queue)
                sealed = await asyncio.to_thread(_seal, queue)
                del self._queue[: len(queue)]
                self._store(sealed)

    def _roll(self) -> None:
        """A full part: the next one starts with its own header and a whole frame."""
        if self._in_part < self._max_file or self._client.size == (0, 0):
            return
        self._take()
        self._part += 1
        self._path = self.first.with_suffix(f".{self._part}.display")
        self._in_part = len(self._header)
        self._sealed.append((self._path, self._header))
        self._key()

    def _store(self, blocks: list[tuple[Path, bytes]]) -> None:
        for path, block in blocks:
            key = displayrec.head(block[: displayrec.HEAD.size])[0]
            why = self._quota(len(block)) if self._quota is not None else ""
            if why or (self._lost and not key):
                # A delta after a lost block would draw on what is not there: drop them all
                # until a key frame is kept again.
                self._lost += len(block)
                self._lost_why = why or self._lost_why
                self._key_bytes = 0  # the next update is a key frame
                continue
            if self._lost:
                self.marker(f"{self._lost} bytes of the display lost: {self._lost_why}")
                self._lost = 0
            if path == self._path:
                self._in_part += len(block)
            if key:
                self._key_bytes, self._since_key = len(block), 0
            else:
                self._since_key += len(block)
            self._sealed.append((path, block))

    def marker(self, text: str) -> None:
        """A note: who attached, left or took over."""
        self._writer.mark(self._now(), text)

    def drain(self) -> list[tuple[Path, bytes]]:
        """The sealed blocks, to append to which file, in order."""
        sealed, self._sealed = self._sealed, []
        return sealed

    def close(self) -> None:
        """The recording ends: the last records are sealed (here: there are few) and the
        connection goes."""
        if self._closed:
            return
        self._closed = True
        for task in self._tasks:
            task.cancel()
        self._writer.end(self._now())
        self._take()
        self._store(_seal(self._queue))
        self._queue = []
        if self._stream is not None:
            closing = asyncio.get_running_loop().create_task(self._stream.close())
            self._tasks.append(closing)


def _seal(queue: list[tuple[Path, tuple[bool, int, bytes]]]) -> list[tuple[Path, bytes]]:
    return [(path, displayrec.seal(key, at, data)) for path, (key, at, data) in queue]


def complete_blocks(file: BinaryIO, size: int) -> int:
    """How many leading bytes of a display recording are its header and whole blocks."""
    file.seek(0)
    try:
        _, offset = displayrec.read_header(file.read(len(displayrec.MAGIC) + 4096))
    except displayrec.DisplayRecordingError:
        return 0
    while offset + displayrec.HEAD.size <= size:
        file.seek(offset)
        with contextlib.suppress(displayrec.DisplayRecordingError):
            _, _, length, _ = displayrec.head(file.read(displayrec.HEAD.size))
            if offset + displayrec.HEAD.size + length <= size:
                offset += displayrec.HEAD.size + length
                continue
        break
    return offset
