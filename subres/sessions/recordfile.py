"""One recording file on disk: appended whole batches at a time, never left half-written.

A recording's file is opened once (`O_APPEND`, no symlink followed at its
last step) and locked (`flock`) for as long as it is written, so that the
repair at start (`repair`) never touches a file some live replica writes.
Each batch of complete lines (asciicast) or complete blocks (display
recordings) is written with as many `write` calls as it takes; a batch that
cannot be written whole (a full disk) is taken back (`ftruncate` to the size
before it), so what stays on disk always ends on a boundary. Before each
batch the path is checked to still name the open file: a recording whose
directory was removed or unmounted stops being written (`RecordingLost`)
instead of going on where nobody can read it.

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
from pathlib import Path
from typing import BinaryIO

__all__ = ["AppendOnly", "RecordingLost", "complete_lines", "identity", "repair"]

log = logging.getLogger(__name__)

TAIL_SCAN = 1 << 16
"""Bytes read back at a time when looking for a file's last complete line."""


class RecordingLost(OSError):
    """The recording's file is no longer where it was made (its directory was removed)."""


class AppendOnly:
    """An open recording file, appended to only in whole batches."""

    def __init__(self, path: Path, *, root: Path, root_id: tuple[int, int] | None) -> None:
        if not root.is_dir() or (root_id is not None and identity(root) != root_id):
            # Never made again here: a root that is missing or another directory than
            # at start is an unmounted volume, where nobody would find what is written.
            raise RecordingLost(errno.ENOENT, "the recordings directory is gone")
        path.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW
        self.path = path
        self._fd = os.open(path, flags, 0o640)
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
        try:
            on_disk = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            raise RecordingLost(errno.ENOENT, "its file was removed") from None
        mine = os.fstat(self._fd)
        if (on_disk.st_dev, on_disk.st_ino) != (mine.st_dev, mine.st_ino):
            raise RecordingLost(errno.ESTALE, "its file was replaced")

    def _take_back(self) -> None:
        try:
            os.ftruncate(self._fd, self.size)
        except OSError as exc:
            log.error("cannot take back a partial write to %s: %s", self.path, exc)

    def close(self) -> None:
        """Close the file (its lock goes with it)."""
        os.close(self._fd)


def identity(path: Path) -> tuple[int, int]:
    """Which file or directory `path` names now: its device and inode."""
    info = os.stat(path)
    return info.st_dev, info.st_ino


def repair(path: Path, *, complete: Callable[[BinaryIO, int], int]) -> int:
    """Cut a torn tail off `path` unless a writer holds it; the bytes cut.

    `complete(file, size)` reads the file and says how many leading bytes
    of it form complete records (`complete_lines` for asciicast).
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return 0
    with os.fdopen(fd, "r+b") as file:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return 0  # a live writer's
        size = os.fstat(fd).st_size
        keep = complete(file, size)
        if keep < size:
            os.ftruncate(fd, keep)
            log.warning("cut a torn tail of %d bytes off %s", size - keep, path)
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
