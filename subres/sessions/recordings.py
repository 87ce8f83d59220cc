"""Recorded sessions: files per object, written by one task, capped per namespace, failing closed.

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
a 503, and once live, a recording that stops being writable (a full disk or
namespace, its folder removed or its volume unmounted) ends every session
in it with close code 4003 and the reason (`Seat.bind`). Other recordings go
on unrecorded and say so in the log.

Files live per object (`recordfiles`: namespace, resource, name, uid), a
machine's console other than its default one named in the file's name; one
larger than `maxFileBytes` goes on in a next part, each playable on its own.
One task writes them all, every `FLUSH_INTERVAL`, in a worker thread (a slow
disk holds no session back), whole batches at a time (`recordfile`): after a
SIGKILL a recording holds everything up to its last flush and no
half-written line or block; a torn tail a kill left inside a `write` is cut
when a replica starts (`start`). Space is shared fairly and no namespace can
take another's:

- each namespace's recordings together stay under `maxNamespaceBytes`:
  past `LOW_WATER` of it, that namespace's own oldest finished recordings
  are deleted, never another namespace's; at the cap its output is dropped
  (a marker counts it; a required recording fails) and its recorded
  consoles and displays refuse new sessions (503, `recorded.check`);
- recordings of consoles and displays recorded `always` or `required` are an
  audit: only `maxAge` deletes them (every finished recording older than it
  goes), never the need for room;
- `maxTotalBytes` bounds the directory as a whole and deletes nothing:
  past it nothing more is recorded until space frees.

Who may read them is RBAC's business: `server.recordinglist` serves them.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
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
from subres.sessions.recordfiles import AUDIT, Folder, RecordingFile, Store
from subres.sessions.registry import SessionKey
from subres.sessions.target import Target

__all__ = [
    "BANNER",
    "LOW_WATER",
    "Quota",
    "Recording",
    "RecordingUnavailable",
    "Recordings",
    "Seat",
    "doomed",
    "title",
]

log = logging.getLogger(__name__)

BANNER = b"\r\n[subres: this console session is recorded]\r\n"
SUFFIXES = {"console": ".cast", "vnc": ".display"}
FLUSH_INTERVAL = 0.5
"""Seconds recorded output may wait in memory before it is written."""
PRUNE_INTERVAL = 60.0
"""Seconds between scans of the directory (ages, sizes, other replicas' files)."""
LOW_WATER = 0.9
"""Share of a namespace's cap past which its oldest deletable recordings go."""
QUIET = 30.0
"""Seconds a file must have been left unwritten before it may be deleted (another
replica, sharing the directory, may still be writing it)."""

Usage = collections.Counter[str]
Quota = Callable[[int], str]
"""Asked before bytes are kept: "" when they may be (and they are counted), or why not."""


class Recording(Protocol):
    """What the writer needs of one recording (a console's `Recorder`, a display's)."""

    @property
    def path(self) -> Path:
        """The file (part) being written now (its name: the folder is the recording's)."""

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


Start = Callable[[Path, Quota], Awaitable[Recording]]
"""Makes and starts the recording that writes the file named `path`, its output asked of
`quota` (a console's `Recorder` joined to its hub, a display's own connection)."""


class RecordingUnavailable(Exception):
    """A required recording cannot start, or failed; the message says why."""


@dataclass(eq=False)
class _Live:
    """One recording in progress, the sessions in it, and its open file."""

    key: SessionKey
    where: Folder
    what: str
    """`Machine default/vm1 console`."""
    required: bool
    recording: Recording | None = None
    seats: set[Seat] = field(default_factory=set)
    file: AppendOnly | None = None
    failure: str = ""
    """Why it can no longer be written, once it cannot."""
    ended: bool = False

    @property
    def started(self) -> Recording:
        assert self.recording is not None
        return self.recording


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
    """Every recording of this replica, the task that writes them, and the space they take."""

    def __init__(self, spec: ConsolesSpec, *, clock: Callable[[], float] = time.time) -> None:
        self.spec = spec
        self.store = Store(Path(spec.recordings)) if spec.recordings else None
        self._clock = clock
        self._live: dict[SessionKey, _Live] = {}
        self._writing: list[_Live] = []
        self._starting: dict[SessionKey, tuple[asyncio.Lock, int]] = {}
        self._usage: Usage = collections.Counter()
        """Bytes per namespace: on disk at the last scan, and kept since."""
        self._full: set[str] = set()
        """Namespaces with no room: at their cap, or with audits alone past `LOW_WATER` (no
        deletion can make room there)."""
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._repairing: asyncio.Task[None] | None = None
        self._scanned = 0.0
        self._crowded = False
        self._legacy_checked = False
        self._stopping = False
        self._root: tuple[int, int] | None = None
        """The directory's identity at start: another one later is an unmounted volume."""

    def wanted(self, spec: SubresourceSpec, obj: Mapping[str, Any]) -> bool:
        """Whether sessions of this console or display are recorded."""
        if self.store is None or spec.name not in SUFFIXES:
            return False
        mode = "always" if spec.record == "required" else spec.record
        annotation = (
            self.spec.record_annotation
            if spec.name == "console"
            else self.spec.record_display_annotation
        )
        return spec.opted_in(mode, obj, annotation)

    def full(self, namespace: str) -> str:
        """Why a recording in `namespace` cannot be kept now ("" when it can)."""
        if namespace in self._full:
            return (
                f"the recordings of namespace {namespace} fill their "
                f"{_amount(self.spec.max_namespace_bytes)} (consoles.recordings.maxNamespaceBytes)"
            )
        if self._usage.total() >= self.spec.max_recordings_bytes:
            return (
                f"the recordings fill their {_amount(self.spec.max_recordings_bytes)} "
                "(consoles.recordings.maxTotalBytes)"
            )
        return ""

    async def join(
        self,
        key: SessionKey,
        *,
        where: Folder,
        audit: bool,
        start: Start,
        who: str,
        what: str,
        required: bool,
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
                    live = _Live(key, where, what, required)
                    live = await self._begin(live, start=start, audit=audit)
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
        live.started.marker(f"{who} attached")
        return seat

    async def _begin(self, live: _Live, *, start: Start, audit: bool) -> _Live | None:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self._clock()))
        # A machine's console other than its default one is named in the file's name.
        unit = f"{live.key.unit}-" if live.key.unit else ""
        name = f"{stamp}-{unit}{secrets.token_hex(4)}{AUDIT if audit else ''}"
        try:
            live.recording = await start(
                Path(name + SUFFIXES[live.key.subresource]), self._quota(live)
            )
        except (OSError, RecordingUnavailable) as exc:
            self._unavailable(live, str(exc))
            return None
        try:
            live.file = await asyncio.to_thread(self._open, live)
        except OSError as exc:
            live.recording.close()
            self._unavailable(live, _why(exc))
            return None
        self._live[live.key] = live
        self._writing.append(live)
        self._run()
        return live

    def _unavailable(self, live: _Live, why: str) -> None:
        if live.required:
            raise RecordingUnavailable(
                f"{live.what} is served only while recorded (record: required), "
                f"and its recording cannot start: {why}"
            )
        log.error("the recording of %s cannot start: %s; going on unrecorded", live.what, why)

    def _open(self, live: _Live) -> AppendOnly:
        """Open the first file and write its header (a worker thread)."""
        assert self.store is not None
        file = AppendOnly(self.store, live.where, live.started.path.name, root=self._root)
        try:
            for _, data in live.started.drain():
                file.append(data)
        except OSError:
            file.close()
            raise
        return file

    def _quota(self, live: _Live) -> Quota:
        """Whether so many bytes of `live` may be kept (counting them if so); a required
        recording that may not keep them fails."""
        namespace = live.where.namespace

        def admit(size: int) -> str:
            if self._usage[namespace] + size > self.spec.max_namespace_bytes * LOW_WATER:
                self._crowded = True  # the writer deletes what it may
                self._wake.set()
            why = ""
            if self._usage[namespace] + size > self.spec.max_namespace_bytes:
                self._full.add(namespace)
                why = f"the recordings of namespace {namespace} are full"
            elif self._usage.total() + size > self.spec.max_recordings_bytes:
                why = "the recordings directory is full"
            if why:
                if live.required and not live.failure:
                    self._failed(live, why)
                return why
            self._usage[namespace] += size
            return ""

        return admit

    def note(self, key: SessionKey, text: str) -> None:
        """A note in `key`'s recording, if it is being recorded (who moderates)."""
        live = self._live.get(key)
        if live is not None:
            live.started.marker(text)

    def marker(self, seat: Seat, text: str) -> None:
        """A note in `seat`'s recording (a takeover)."""
        seat._live.started.marker(text)

    def left(self, live: _Live, seat: Seat) -> None:
        """`seat`'s session ended; the recording ends with the last one."""
        if seat not in live.seats:
            return
        live.seats.discard(seat)
        live.started.marker(f"{seat.who} left")
        if not live.seats:
            self._end(live)

    def _end(self, live: _Live) -> None:
        if live.ended:
            return
        live.ended = True
        live.started.close()
        if self._live.get(live.key) is live:
            del self._live[live.key]
        self._wake.set()

    def _run(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._write(), name="recordings")

    async def start(self) -> None:
        """Make the directory; cut the torn tails a killed replica left (in the background)."""
        if self.store is None:
            return
        root = self.store.root
        try:
            await asyncio.to_thread(root.mkdir, parents=True, exist_ok=True)
            self._root = identity(root)
        except OSError as exc:
            log.error("cannot make the recordings directory %s: %s", root, exc)
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
            due = self._crowded or time.monotonic() - self._scanned > PRUNE_INTERVAL
            if due or stopping:
                self._crowded, self._scanned = False, time.monotonic()
            await self._flush_now(prune=due or stopping)
            if stopping:
                return

    async def _flush_now(self, *, prune: bool) -> None:
        jobs = [(live, live.started.drain()) for live in self._writing]
        done = [live for live in self._writing if live.ended]
        self._writing = [live for live in self._writing if not live.ended]
        busy = {(live.where, live.started.path.name) for live in self._writing}
        failures, scanned = await asyncio.to_thread(
            self._flush, jobs, done, prune=prune and self.store is not None, busy=busy
        )
        self._took(scanned)
        failures += [(live, live.started.failure) for live in self._writing]
        for live, reason in failures:
            if reason and not live.failure:
                self._failed(live, reason)

    def _flush(
        self,
        jobs: list[tuple[_Live, list[tuple[Path, bytes]]]],
        done: list[_Live],
        *,
        prune: bool,
        busy: set[tuple[Folder, str]],
    ) -> tuple[list[tuple[_Live, str]], tuple[Usage, Usage] | None]:
        """Append to the files (a worker thread); then, when asked, delete what must go and
        count what stays: all, and audits."""
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
        return failures, self._prune(busy) if prune else None

    def _append(self, live: _Live, writes: list[tuple[Path, bytes]]) -> None:
        assert self.store is not None
        if live.failure and live.required:
            return
        for path, data in writes:
            if live.file is None or live.file.name != path.name:
                if live.file is not None:
                    live.file.close()
                live.file = None
                live.file = AppendOnly(self.store, live.where, path.name, root=self._root)
            live.file.append(data)

    def _failed(self, live: _Live, why: str) -> None:
        first = not live.failure
        live.failure = f"the recording failed ({why}); record: required"
        where = "/".join(live.where.parts)
        if not live.required:
            if first:
                log.error(
                    "recording %s of %s failed: %s; what it misses is lost", where, live.what, why
                )
            return
        log.error(
            "recording %s of %s failed: %s; ending its sessions (record: required)",
            where,
            live.what,
            why,
        )
        for seat in list(live.seats):
            seat.fail(live.failure)

    def _took(self, scanned: tuple[Usage, Usage] | None) -> None:
        """What the disk held after a scan and the deletions it allowed: all, and audits."""
        if scanned is None:
            return
        self._usage, audits = scanned
        cap = self.spec.max_namespace_bytes
        self._full = {ns for ns, size in self._usage.items() if size >= cap}
        self._full |= {ns for ns, size in audits.items() if size >= cap * LOW_WATER}

    def _prune(self, busy: set[tuple[Folder, str]]) -> tuple[Usage, Usage]:
        """Delete what must go, count what stays (a worker thread)."""
        assert self.store is not None
        files = self.store.scan()
        if not self._legacy_checked and (legacy := self.store.legacy()):
            log.warning(
                "%d recordings in the first layout (DIR/NAMESPACE/NAME) are not served: "
                "nothing says which kind of object they belong to",
                legacy,
            )
        self._legacy_checked = True
        for file in doomed(files, spec=self.spec, now=self._clock(), busy=busy):
            try:
                self.store.delete(file)
                files.remove(file)
                log.info("deleted recording %s/%s", "/".join(file.folder.parts), file.name)
            except OSError as exc:
                log.error("cannot delete recording %s: %s", file.name, exc)
        usage: Usage = collections.Counter()
        audits: Usage = collections.Counter()
        for file in files:
            usage[file.folder.namespace] += file.size
            if file.audit:
                audits[file.folder.namespace] += file.size
        return usage, audits

    def _repair_all(self) -> None:
        assert self.store is not None
        for file in self.store.scan():
            repair(self.store, file, complete=_complete(file))


def doomed(
    files: list[RecordingFile], *, spec: ConsolesSpec, now: float, busy: set[tuple[Folder, str]]
) -> list[RecordingFile]:
    """The files to delete: any past `maxAge`; and in each namespace past `LOW_WATER` of its
    cap, its oldest that are not an audit, until it is under again. Files being written (here,
    or lately by another replica) stay."""
    idle = [f for f in files if (f.folder, f.name) not in busy and now - f.mtime > QUIET]
    old = {id(f) for f in idle if spec.max_age and now - f.mtime > spec.max_age}
    doomed = [f for f in idle if id(f) in old]
    sizes: Usage = collections.Counter()
    for file in files:
        if id(file) not in old:
            sizes[file.folder.namespace] += file.size
    limit = spec.max_namespace_bytes * LOW_WATER
    for file in sorted(idle, key=lambda f: f.mtime):
        namespace = file.folder.namespace
        if id(file) not in old and not file.audit and sizes[namespace] > limit:
            doomed.append(file)
            sizes[namespace] -= file.size
    return doomed


def title(target: Target) -> str:
    """A recording's title: `Machine default/vm1 console` (`… console serial1` for another,
    `… vnc` for the display)."""
    unit = f" {target.spec.unit}" if target.spec.unit else ""
    return f"{target.describe()} {target.spec.name}{unit}"


def _complete(file: RecordingFile) -> Callable[[BinaryIO, int], int]:
    return complete_blocks if file.name.endswith(".display") else complete_lines


def _amount(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} bytes"


def _why(exc: OSError) -> str:
    """`No space left on device`, or the message a `RecordingLost` carries."""
    return exc.strerror or str(exc)
