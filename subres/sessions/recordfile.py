"""One recording file being written: appended whole batches at a time, never left half-written.

A recording's file is opened once (through `recordfiles.Store`, no link
followed at any step) and locked (`flock`) for as long as it is written, so
that the repair at start (`repair`) never touches a file some live replica
writes. Each batch of complete lines (asciicast) or complete blocks (display
recordings) is written with as many `write` calls as it takes; a batch that
cannot be written whole (a full disk) is taken back (`ftruncate` to the size
before it), so what stays on disk always ends on a boundary. Before each
batch the folder is checked to still hold the open file: a recording whose
folder was removed, or whose volume was unmounted, stops being written
(`RecordingLost`) instead of going on where nobody can read it.

A process killed in the middle of a `write` (SIGKILL lands between the
pages of a large batch) can still leave a torn tail; `repair` cuts it off
the next time a replica starts, once no writer holds the file's lock.
Everything here blocks: it runs in the recordings' worker thread.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
from collections.abc import Callable
from typing import BinaryIO

from subres.sessions.recordfiles import Folder, RecordingFile, RecordingLost, Store

__all__ = ["AppendOnly", "complete_lines", "identity", "repair"]

log = logging.getLogger(__name__)

TAIL_SCAN = 1 << 16
"""Bytes read back at a time when looking for a file's last complete line."""


class AppendOnly:
    """An open recording file, appended to only in whole batches."""

    def __init__(
        self, store: Store, where: Folder, name: str, *, root: tuple[int, int] | None
    ) -> None:
        self.where, self.name = where, name
        self._store = store
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
        self._fd = store.opened(where, name, flags, root=root)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self.size = os.fstat(self._fd).st_size
        except OSError:
            os.close(self._fd)
            raise

    def append(self, data: bytes) -> None:
        """Write `data` whole, or not at all (raising the reason)."""
        self._check()
        view = memoryview(data)
        try:
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
        except OSError:
            self._take_back()
            raise
        self.size += len(data)

    def _check(self) -> None:
        on_disk = self._store.located(self.where, self.name)
        if on_disk is None:
            raise RecordingLost(errno.ENOENT, "its file was removed")
        mine = os.fstat(self._fd)
        if on_disk != (mine.st_dev, mine.st_ino):
            raise RecordingLost(errno.ESTALE, "its file was replaced")

    def _take_back(self) -> None:
        try:
            os.ftruncate(self._fd, self.size)
        except OSError as exc:
            log.error("cannot take back a partial write to %s: %s", self.name, exc)

    def close(self) -> None:
        """Close the file (its lock goes with it)."""
        os.close(self._fd)


def identity(path: os.PathLike[str] | str) -> tuple[int, int]:
    """Which file or directory `path` names now: its device and inode."""
    info = os.stat(path)
    return info.st_dev, info.st_ino


def repair(store: Store, file: RecordingFile, *, complete: Callable[[BinaryIO, int], int]) -> int:
    """Cut a torn tail off `file` unless a writer holds it; the bytes cut.

    `complete(file, size)` reads the file and says how many leading bytes
    of it form complete records (`complete_lines` for asciicast).
    """
    try:
        fd = store.opened(file.folder, file.name, os.O_RDWR, root=None)
    except OSError:
        return 0
    with os.fdopen(fd, "r+b") as opened:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return 0  # a live writer's
        size = os.fstat(fd).st_size
        keep = complete(opened, size)
        if keep < size:
            os.ftruncate(fd, keep)
            log.warning("cut a torn tail of %d bytes off %s", size - keep, file.name)
        return size - keep


def complete_lines(file: BinaryIO, size: int) -> int:
    """The size of a line-oriented file up to its last newline, read back from the end."""
    end = size
    while end > 0:
        start = max(0, end - TAIL_SCAN)
        file.seek(start)
        chunk = file.read(end - start)
        cut = chunk.rfind(b"\n")
        if cut >= 0:
            return start + cut + 1
        end = start
    return 0
