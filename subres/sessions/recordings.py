"""Recorded console sessions: asciicast files in one directory, capped and rotated.

A console is recorded when `consoles.recordings.directory` is set and its
parent opts in (`console.record: always`, or `annotated` and the
`consoles.recordAnnotation` annotation "true"). A recording covers a
console while anyone is attached to it: it starts with the first session,
writer or observer, ends with the last, and holds the output everybody saw,
the writer's resizes, and a marker each time someone attaches or leaves (so
a takeover shows as who came and who went). Input is not recorded: it holds
what people type, passwords included, and the output shows its echo.
Everyone recorded is told so (`BANNER`, first on their stdout).

Files are `DIR/NAMESPACE/NAME/STAMP-ID.cast`; one larger than
`maxFileBytes` goes on in `…-ID.2.cast` and so on. One task writes them all
(in a worker thread, so a slow disk holds no session back); when all
recordings together pass `maxTotalBytes`, the oldest finished files are
deleted. Who may read them is RBAC's business: `recordinglist` serves them.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from subres.config import ConsolesSpec, SubresourceSpec
from subres.sessions.hub import Hub
from subres.sessions.recorder import Recorder

__all__ = ["BANNER", "FILE_NAME", "Recordings"]

log = logging.getLogger(__name__)

BANNER = b"\r\n[subres: this console session is recorded]\r\n"
FILE_NAME = re.compile(r"\A\d{8}T\d{6}Z-[0-9a-f]{8}(\.\d+)?\.cast\Z")
"""What a recording's file name looks like; nothing else is ever opened."""
FLUSH_INTERVAL = 0.5
"""Seconds recorded output may wait in memory before it is written."""
PRUNE_INTERVAL = 60.0
"""Seconds between checks of the total size while recordings only grow."""


class Recordings:
    """Every recording of this replica, and the task that writes them."""

    def __init__(self, spec: ConsolesSpec) -> None:
        self.spec = spec
        self.directory = Path(spec.recordings) if spec.recordings else None
        self._recorders: list[Recorder] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._pruned = 0.0

    def wanted(self, spec: SubresourceSpec, obj: Mapping[str, Any]) -> bool:
        """Whether sessions of this console are recorded."""
        return self.directory is not None and spec.opted_in(
            spec.record, obj, self.spec.record_annotation
        )

    def joined(self, hub: Hub, *, namespace: str, name: str, title: str, who: str) -> None:
        """A session attached to a recorded console; its recording starts if it is the first."""
        recorder = _recorder(hub)
        if recorder is None:
            assert self.directory is not None
            stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
            path = self.directory / namespace / name / f"{stamp}-{secrets.token_hex(4)}.cast"
            recorder = Recorder(
                path, title=title, max_file=self.spec.max_recording_bytes, size=hub.size
            )
            hub.add_sink(recorder)
            self._recorders.append(recorder)
            self._start()
            if hub.scrollback is not None:
                # What a kept console replays to the first to attach is part of what they saw.
                recorder.output(hub.scrollback.tail())
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

    def _start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._write(), name="recordings")

    async def stop(self) -> None:
        """Write what is left, then stop."""
        if self._task is None:
            return
        self._task.cancel()
        await asyncio.wait([self._task])
        self._task = None
        await asyncio.to_thread(self._flush, self._jobs(), prune=self.directory is not None)

    async def _write(self) -> None:
        while True:
            try:
                async with asyncio.timeout(FLUSH_INTERVAL):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            parts = [r.path for r in self._recorders]
            jobs = self._jobs()
            # A finished file (a recording ended, or a part filled up) may put the total over.
            finished = [r.path for r in self._recorders] != parts
            due = time.monotonic() - self._pruned > PRUNE_INTERVAL
            if finished or due:
                self._pruned = time.monotonic()
            await asyncio.to_thread(self._flush, jobs, prune=finished or due)

    def _jobs(self) -> list[tuple[Path, bytes]]:
        jobs = [job for recorder in self._recorders for job in recorder.drain()]
        self._recorders = [r for r in self._recorders if not r.closed]
        return jobs

    def _flush(self, jobs: list[tuple[Path, bytes]], *, prune: bool = False) -> None:
        """Append to the files (a worker thread); then delete the oldest past the cap."""
        for path, data in jobs:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                with path.open("ab") as file:
                    file.write(data)
            except OSError as exc:
                log.error("recording %s: %s", path, exc)
        if prune:
            self._prune(open_files={r.path for r in self._recorders})

    def _prune(self, *, open_files: set[Path]) -> None:
        assert self.directory is not None
        files = []
        for path in self.directory.glob("*/*/*.cast"):
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


def _recorder(hub: Hub) -> Recorder | None:
    return next((s for s in hub.sinks if isinstance(s, Recorder)), None)
