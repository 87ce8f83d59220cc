"""Recorded sessions: files in one directory, written by one task, capped, rotated, failing closed.

A console or display is recorded when `consoles.recordings.directory` is set
and its parent opts in (`record: always`, `required`, or `annotated` and the
parent's annotation "true"). A recording covers a console or display while
anyone is attached to it: it starts with the first session, ends with the
last, and holds what everybody saw plus a marker each time someone attaches,
leaves or takes over. Input is not recorded: it holds what people type,
passwords included, and the output shows its echo. Everyone recorded is told
so (`BANNER`, first on a console's stdout).

A session joins the recording before its upgrade (`join`): the first one
starts it, which opens its file and writes its header, so that a recording
that cannot start is still an HTTP `Status`. With `record: required` that is
a 503, and once live, a recording that stops being writable (a full disk,
its directory removed or unmounted) ends every session in it with close
code 4003 and the reason (`Seat.bind`). Other recordings go on unrecorded
and say so in the log.

Files are `DIR/NAMESPACE/NAME/STAMP-ID.cast` (consoles, asciicast v2) and
`…-ID.display` (displays, `protocol.displayrec`); one larger than
`maxFileBytes` goes on in `…-ID.2.cast` and so on, each part playable on its
own. One task writes them all, every `FLUSH_INTERVAL`, in a worker thread
(a slow disk holds no session back), whole batches at a time
(`recordfile.AppendOnly`): after a SIGKILL a recording holds everything up
to its last flush and no half-written line or block; a torn tail the kill
left inside a `write` is cut when a replica starts (`start`). When all
recordings together pass `maxTotalBytes`, the oldest finished files are
deleted. Who may read them is RBAC's business: `recordinglist` serves them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from subres.config import ConsolesSpec, SubresourceSpec
from subres.engine.websocket import CloseCode
from subres.sessions.display import complete_blocks
from subres.sessions.hub import Closer
from subres.sessions.recordfile import AppendOnly, complete_lines, identity, repair
from subres.sessions.registry import SessionKey

__all__ = [
    "BANNER",
    "FILE_NAME",
    "Recording",
    "RecordingUnavailable",
    "Recordings",
    "Seat",
]

log = logging.getLogger(__name__)

BANNER = b"\r\n[subres: this console session is recorded]\r\n"
FILE_NAME = re.compile(r"\A\d{8}T\d{6}Z-[0-9a-f]{8}(\.\d+)?\.(cast|display)\Z")
"""What a recording's file name looks like; nothing else is ever opened."""
SUFFIXES = {"console": ".cast", "vnc": ".display"}
FLUSH_INTERVAL = 0.5
"""Seconds recorded output may wait in memory before it is written."""
PRUNE_INTERVAL = 60.0
"""Seconds between checks of the total size while recordings only grow."""


class Recording(Protocol):
    """What the writer needs of one recording (a console's `Recorder`, a display's)."""

    @property
    def path(self) -> Path:
        """The file (part) being written now."""

    @property
    def failure(self) -> str:
        """Why the recording stopped on its own (a display it lost), or ""."""

    def marker(self, text: str) -> None:
        """A note: who attached, left or took over."""

    def drain(self) -> list[tuple[Path, bytes]]:
        """What to append to which file now, in order, each a whole batch."""

    def close(self) -> None:
        """The recording ends: what is left is queued for `drain`, and whatever feeds it
        lets it go."""


Start = Callable[[Path], Awaitable[Recording]]
"""Makes and starts the recording that writes `path` (a console's `Recorder` joined to its hub,
a display's own connection)."""


class RecordingUnavailable(Exception):
    """A required recording cannot start, or failed; the message says why."""


@dataclass(eq=False)
class _Live:
    """One recording in progress, the sessions in it, and its open file."""

    key: SessionKey
    recording: Recording
    what: str
    """`Machine default/vm1 console`."""
    required: bool
    seats: set[Seat] = field(default_factory=set)
    file: AppendOnly | None = None
    failure: str = ""
    """Why it can no longer be written, once it cannot."""
    ended: bool = False


class Seat:
    """One session's place in a recording, from before its upgrade to its end."""

    def __init__(self, recordings: Recordings, live: _Live, who: str) -> None:
        self._recordings = recordings
        self._live = live
        self.who = who
        self._closer: Closer | None = None

    def bind(self, closer: Closer) -> None:
        """The session is live: `closer` ends it if its required recording fails."""
        self._closer = closer
        if self._live.failure and self._live.required:
            closer(CloseCode.RECORDING_FAILED, self._live.failure)

    def fail(self, reason: str) -> None:
        """The required recording failed: end the session, saying why."""
        if self._closer is not None:
            self._closer(CloseCode.RECORDING_FAILED, reason)

    def leave(self) -> None:
        """The session ended; the recording ends with the last one."""
        self._recordings.left(self._live, self)


class Recordings:
    """Every recording of this replica, and the task that writes them."""

    def __init__(self, spec: ConsolesSpec) -> None:
        self.spec = spec
        self.directory = Path(spec.recordings) if spec.recordings else None
        self._live: dict[SessionKey, _Live] = {}
        self._writing: list[_Live] = []
        self._starting: dict[SessionKey, tuple[asyncio.Lock, int]] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._repairing: asyncio.Task[None] | None = None
        self._pruned = 0.0
        self._root_id: tuple[int, int] | None = None
        self._stopping = False
        """The directory's identity at start: another one later is an unmounted volume."""

    def wanted(self, spec: SubresourceSpec, obj: Mapping[str, Any]) -> bool:
        """Whether sessions of this console or display are recorded."""
        if self.directory is None or spec.name not in SUFFIXES:
            return False
        mode = "always" if spec.record == "required" else spec.record
        annotation = (
            self.spec.record_annotation
            if spec.name == "console"
            else self.spec.record_display_annotation
        )
        return spec.opted_in(mode, obj, annotation)

    async def join(
        self, key: SessionKey, *, start: Start, who: str, what: str, required: bool
    ) -> Seat | None:
        """A session joins `key`'s recording, which starts if it is the first.

        None when the recording cannot start and is not required; raises
        `RecordingUnavailable` when it is.
        """
        # One start at a time per recording: who comes while it starts joins it.
        lock, waiting = self._starting.get(key, (asyncio.Lock(), 0))
        self._starting[key] = (lock, waiting + 1)
        try:
            async with lock:
                live = self._live.get(key)
                if live is None or (live.failure and required):
                    live = await self._begin(key, start=start, what=what, required=required)
        finally:
            lock, waiting = self._starting[key]
            if waiting == 1:
                del self._starting[key]
            else:
                self._starting[key] = (lock, waiting - 1)
        if live is None:
            return None
        seat = Seat(self, live, who)
        live.seats.add(seat)
        live.recording.marker(f"{who} attached")
        return seat

    async def _begin(
        self, key: SessionKey, *, start: Start, what: str, required: bool
    ) -> _Live | None:
        assert self.directory is not None
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        name = f"{stamp}-{secrets.token_hex(4)}{SUFFIXES[key.subresource]}"
        path = self.directory / key.namespace / key.name / name
        try:
            recording = await start(path)
        except (OSError, RecordingUnavailable) as exc:
            self._unavailable(what, str(exc), required=required)
            return None
        live = _Live(key, recording, what, required)
        try:
            live.file = await asyncio.to_thread(self._open, live)
        except OSError as exc:
            recording.close()
            self._unavailable(what, _why(exc), required=required)
            return None
        self._live[key] = live
        self._writing.append(live)
        self._run()
        return live

    def _unavailable(self, what: str, why: str, *, required: bool) -> None:
        if required:
            raise RecordingUnavailable(
                f"{what} is served only while recorded (record: required), "
                f"and its recording cannot start: {why}"
            )
        log.error("the recording of %s cannot start: %s; going on unrecorded", what, why)

    def _open(self, live: _Live) -> AppendOnly:
        """Open the first file and write its header (a worker thread)."""
        assert self.directory is not None
        file = AppendOnly(live.recording.path, root=self.directory, root_id=self._root_id)
        try:
            for _, data in live.recording.drain():
                file.append(data)
        except OSError:
            file.close()
            raise
        return file

    def note(self, key: SessionKey, text: str) -> None:
        """A note in `key`'s recording, if it is being recorded (who moderates)."""
        live = self._live.get(key)
        if live is not None:
            live.recording.marker(text)

    def marker(self, seat: Seat, text: str) -> None:
        """A note in `seat`'s recording (a takeover)."""
        seat._live.recording.marker(text)

    def left(self, live: _Live, seat: Seat) -> None:
        """`seat`'s session ended; the recording ends with the last one."""
        if seat not in live.seats:
            return
        live.seats.discard(seat)
        live.recording.marker(f"{seat.who} left")
        if not live.seats:
            self._end(live)

    def _end(self, live: _Live) -> None:
        if live.ended:
            return
        live.ended = True
        live.recording.close()
        if self._live.get(live.key) is live:
            del self._live[live.key]
        self._wake.set()

    def _run(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._write(), name="recordings")

    async def start(self) -> None:
        """Make the directory; cut the torn tails a killed replica left (in the background)."""
        if self.directory is None:
            return
        try:
            await asyncio.to_thread(self.directory.mkdir, parents=True, exist_ok=True)
            self._root_id = identity(self.directory)
        except OSError as exc:
            log.error("cannot make the recordings directory %s: %s", self.directory, exc)
            return
        self._repairing = asyncio.create_task(
            asyncio.to_thread(self._repair_all), name="recordings repair"
        )

    async def stop(self) -> None:
        """End every recording, write what is left, then stop."""
        if self._repairing is not None:
            await asyncio.wait([self._repairing])
        for live in list(self._live.values()):
            self._end(live)
        if self._task is None:
            return
        # Not cancelled: a flush under way finishes, then one more takes what is left.
        self._stopping = True
        self._wake.set()
        await asyncio.wait([self._task])
        self._task = None
        self._stopping = False

    async def _write(self) -> None:
        while True:
            stopping = self._stopping  # then this flush is the last
            if not stopping:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(FLUSH_INTERVAL):
                        await self._wake.wait()
            self._wake.clear()
            parts = [live.recording.path for live in self._writing]
            ended = any(live.ended for live in self._writing)
            due = time.monotonic() - self._pruned > PRUNE_INTERVAL
            await self._flush_now(prune=ended or due or stopping, parts=parts)
            if stopping:
                return

    async def _flush_now(self, *, prune: bool, parts: list[Path] | None = None) -> None:
        jobs = [(live, live.recording.drain()) for live in self._writing]
        # A finished file (a recording ended, or a part filled up) may put the total over.
        rolled = parts is not None and [live.recording.path for live in self._writing] != parts
        if prune or rolled:
            self._pruned = time.monotonic()
        done = [live for live in self._writing if live.ended]
        self._writing = [live for live in self._writing if not live.ended]
        open_files = {live.recording.path for live in self._writing}
        failures = await asyncio.to_thread(
            self._flush, jobs, done, prune=(prune or rolled) and self.directory is not None,
            open_files=open_files,
        )  # fmt: skip
        failures += [(live, live.recording.failure) for live in self._writing]
        for live, reason in failures:
            if reason and not live.failure:
                self._failed(live, reason)

    def _flush(
        self,
        jobs: list[tuple[_Live, list[tuple[Path, bytes]]]],
        done: list[_Live],
        *,
        prune: bool,
        open_files: set[Path],
    ) -> list[tuple[_Live, str]]:
        """Append to the files (a worker thread); then delete the oldest past the cap."""
        failures = []
        for live, writes in jobs:
            try:
                self._append(live, writes)
            except OSError as exc:
                failures.append((live, _why(exc)))
        for live in done:
            if live.file is not None:
                live.file.close()
                live.file = None
        if prune:
            self._prune(open_files=open_files)
        return failures

    def _append(self, live: _Live, writes: list[tuple[Path, bytes]]) -> None:
        assert self.directory is not None
        if live.failure and live.required:
            return
        for path, data in writes:
            if live.file is None or live.file.path != path:
                if live.file is not None:
                    live.file.close()
                live.file = None
                live.file = AppendOnly(path, root=self.directory, root_id=self._root_id)
            live.file.append(data)

    def _failed(self, live: _Live, why: str) -> None:
        first = not live.failure
        live.failure = f"the recording failed ({why}); record: required"
        path = live.recording.path
        if not live.required:
            if first:
                log.error(
                    "recording %s of %s failed: %s; what it misses is lost", path, live.what, why
                )
            return
        log.error(
            "recording %s of %s failed: %s; ending its sessions (record: required)",
            path,
            live.what,
            why,
        )
        for seat in list(live.seats):
            seat.fail(live.failure)

    def _prune(self, *, open_files: set[Path]) -> None:
        assert self.directory is not None
        files = []
        for path in self.directory.glob("*/*/*"):
            if not FILE_NAME.match(path.name):
                continue
            try:
                info = path.stat()
            except OSError:
                continue
            files.append((info.st_mtime, info.st_size, path))
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files):
            if total <= self.spec.max_recordings_bytes:
                break
            if path in open_files:
                continue
            try:
                path.unlink()
            except OSError as exc:
                log.error("cannot delete old recording %s: %s", path, exc)
                continue
            log.info("deleted old recording %s (recordings over their cap)", path)
            total -= size

    def _repair_all(self) -> None:
        assert self.directory is not None
        for path in self.directory.glob("*/*/*"):
            if FILE_NAME.match(path.name):
                repair(path, complete=_complete(path))


def _complete(path: Path) -> Callable[[BinaryIO, int], int]:
    return complete_blocks if path.suffix == ".display" else complete_lines


def _why(exc: OSError) -> str:
    """`No space left on device`, or the message a `RecordingLost` carries."""
    return exc.strerror or str(exc)
