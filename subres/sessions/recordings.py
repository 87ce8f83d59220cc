"""Recorded console sessions: asciicast files per object, capped per namespace, kept for audit.

A console is recorded when `consoles.recordings.directory` is set and its
parent opts in (`console.record: always`, or `annotated` and the
`consoles.recordAnnotation` annotation "true"). A recording covers a
console while anyone is attached to it: it starts with the first session,
writer or observer, ends with the last, and holds the output everybody saw,
the writer's resizes, and a marker each time someone attaches or leaves (so
a takeover shows as who came and who went). Input is not recorded: it holds
what people type, passwords included, and the output shows its echo.
Everyone recorded is told so (`BANNER`, first on their stdout).

Files live per object (`recordfiles`: namespace, resource, name, uid), one
console of it per name (`STAMP-CONSOLE-ID` for a machine's console other
than its default one); one larger than `maxFileBytes` goes on in a next
part. One task writes them all in a worker thread, so a slow disk holds no
session back. Space is shared
fairly and no namespace can take another's:

- each namespace's recordings together stay under `maxNamespaceBytes`:
  past `LOW_WATER` of it, that namespace's own oldest finished recordings
  are deleted, never another namespace's; at the cap its output is dropped
  (a marker counts it) and its recorded consoles refuse new sessions (503);
- recordings of consoles recorded `always` are an audit: only `maxAge`
  deletes them (every finished recording older than it goes), never the
  need for room;
- `maxTotalBytes` bounds the directory as a whole and deletes nothing:
  past it nothing more is recorded until space frees.

Who may read them is RBAC's business: `server.recordinglist` serves them.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import secrets
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from subres.config import ConsolesSpec, SubresourceSpec
from subres.sessions.hub import Hub
from subres.sessions.recorder import Recorder
from subres.sessions.recordfiles import AUDIT, Folder, RecordingFile, Store
from subres.sessions.target import Target

__all__ = ["BANNER", "LOW_WATER", "Recordings", "doomed", "title"]

log = logging.getLogger(__name__)

BANNER = b"\r\n[subres: this console session is recorded]\r\n"
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


class Recordings:
    """Every recording of this replica, the task that writes them, and the space they take."""

    def __init__(self, spec: ConsolesSpec, *, clock: Callable[[], float] = time.time) -> None:
        self.spec = spec
        self.store = Store(Path(spec.recordings)) if spec.recordings else None
        self._clock = clock
        self._recorders: dict[Recorder, Folder] = {}
        self._usage: Usage = collections.Counter()
        """Bytes per namespace: on disk at the last scan, and kept since."""
        self._full: set[str] = set()
        """Namespaces with no room: at their cap, or with audits alone past `LOW_WATER` (no
        deletion can make room there)."""
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._scanned = 0.0
        self._crowded = False
        self._legacy_checked = False
        self._stopping = False

    def wanted(self, spec: SubresourceSpec, obj: Mapping[str, Any]) -> bool:
        """Whether sessions of this console are recorded."""
        return self.store is not None and spec.opted_in(
            spec.record, obj, self.spec.record_annotation
        )

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

    def joined(
        self,
        hub: Hub,
        *,
        where: Folder,
        audit: bool,
        title: str,
        who: str,
        unit: str = "",
    ) -> None:
        """A session attached to a recorded console (`unit`: which of the machine's, when it
        is not the default one); its recording starts if it is the first."""
        recorder = _recorder(hub)
        if recorder is None:
            stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self._clock()))
            console = f"{unit}-" if unit else ""
            name = f"{stamp}-{console}{secrets.token_hex(4)}{AUDIT if audit else ''}.cast"
            recorder = Recorder(
                Path(name),
                title=title,
                max_file=self.spec.max_recording_bytes,
                size=hub.size,
                quota=self._quota(where.namespace),
            )
            hub.add_sink(recorder)
            self._recorders[recorder] = where
            self._start()
            if hub.scrollback is not None:
                # What a kept console replays to the first to attach is part of what they saw.
                recorder.output(hub.scrollback.tail())
            for note in hub.notes:
                recorder.marker(note)
            hub.notes.clear()
        recorder.attached += 1
        recorder.marker(f"{who} attached")

    def left(self, hub: Hub, *, who: str) -> None:
        """A recorded session ended; the recording ends with the last one."""
        recorder = _recorder(hub)
        if recorder is None:
            return
        recorder.marker(f"{who} left")
        recorder.attached -= 1
        if recorder.attached == 0:
            recorder.close()
            hub.remove_sink(recorder)
            self._wake.set()

    def _quota(self, namespace: str) -> Callable[[int], str]:
        """Whether a line of so many bytes may be kept for `namespace` (counting it if so)."""

        def admit(size: int) -> str:
            if self._usage[namespace] + size > self.spec.max_namespace_bytes * LOW_WATER:
                self._crowded = True  # the writer deletes what it may
                self._wake.set()
            if self._usage[namespace] + size > self.spec.max_namespace_bytes:
                self._full.add(namespace)
                return f"the recordings of namespace {namespace} are full"
            if self._usage.total() + size > self.spec.max_recordings_bytes:
                return "the recordings directory is full"
            self._usage[namespace] += size
            return ""

        return admit

    def _start(self) -> None:
        if self._task is None:
            self._stopping = False
            self._task = asyncio.create_task(self._write(), name="recordings")

    async def stop(self) -> None:
        """Write what is left, then stop.

        A write in progress is finished, not cancelled: a cancelled worker thread
        would go on writing after the last lines, out of order.
        """
        if self._task is None:
            return
        self._stopping = True
        self._wake.set()
        await asyncio.wait([self._task])
        self._task, self._stopping = None, False
        self._took(await asyncio.to_thread(self._flush, self._jobs(), busy=set(), prune=True))

    async def _write(self) -> None:
        while not self._stopping:
            try:
                async with asyncio.timeout(FLUSH_INTERVAL):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            jobs = self._jobs()
            due = self._crowded or time.monotonic() - self._scanned > PRUNE_INTERVAL
            busy = {(where, recorder.path.name) for recorder, where in self._recorders.items()}
            if due:
                self._crowded, self._scanned = False, time.monotonic()
            self._took(await asyncio.to_thread(self._flush, jobs, busy=busy, prune=due))

    def _took(self, scanned: tuple[Usage, Usage] | None) -> None:
        """What the disk held after a scan and the deletions it allowed: all, and audits."""
        if scanned is None:
            return
        self._usage, audits = scanned
        cap = self.spec.max_namespace_bytes
        self._full = {ns for ns, size in self._usage.items() if size >= cap}
        self._full |= {ns for ns, size in audits.items() if size >= cap * LOW_WATER}

    def _jobs(self) -> list[tuple[Folder, str, bytes]]:
        jobs = [
            (where, path.name, data)
            for recorder, where in self._recorders.items()
            for path, data in recorder.drain()
        ]
        self._recorders = {r: w for r, w in self._recorders.items() if not r.closed}
        return jobs

    def _flush(
        self, jobs: list[tuple[Folder, str, bytes]], *, busy: set[tuple[Folder, str]], prune: bool
    ) -> tuple[Usage, Usage] | None:
        """Append to the files (a worker thread); then, when asked, delete what must go and
        count what stays: all, and audits."""
        assert self.store is not None
        for where, name, data in jobs:
            try:
                self.store.append(where, name, data)
            except OSError as exc:
                log.error("recording %s/%s: %s", "/".join(where.parts), name, exc)
        if not prune:
            return None
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


def _amount(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} bytes"


def title(target: Target) -> str:
    """A recording's title: `Machine default/vm1 console` (`… console serial1` for another)."""
    unit = f" {target.spec.unit}" if target.spec.unit else ""
    return f"{target.describe()} console{unit}"


def _recorder(hub: Hub) -> Recorder | None:
    return next((s for s in hub.sinks if isinstance(s, Recorder)), None)
