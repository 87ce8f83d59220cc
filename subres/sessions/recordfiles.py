"""Recordings on disk: where each one lives, and every file touched without following a link.

Layout: `DIR/NAMESPACE/RESOURCE/NAME/UID/STAMP-[CONSOLE-]ID[.audit][.N].cast` (a
console's, asciicast; the console named when it is not the machine's default
one) and `….display` (a display's, `protocol.displayrec`).

- The namespace comes first: a namespace's recordings are one subtree,
  counted and capped together, and nothing done for one namespace touches
  another's.
- The parent's resource and uid follow its name: a recording belongs to one
  object of one kind. Another kind's object of the same name, or a new object
  reusing the name, sees none of it.
- `.audit` marks a recording of a console or display recorded `always` or
  `required`: only its age may delete it. `.N` is a file's part number (a long recording goes on in
  parts).

Every path is walked beneath `DIR` one component at a time with `O_NOFOLLOW`
(directories with `O_DIRECTORY`), and every file is checked to be a regular
file, so a link put in the directory (to another namespace's folder, or
outside) is never followed, for reading, writing or deleting alike. These
are blocking calls: callers run them in a worker thread.

Files of the first layout (`DIR/NAMESPACE/NAME/…`, no kind) are left where
they are and never served, counted nor deleted: nothing says which kind of
object they belong to (`legacy` counts them, for a warning).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

__all__ = ["FILE_NAME", "Folder", "RecordingFile", "RecordingLost", "Store", "folder"]

FILE_NAME = re.compile(
    r"\A\d{8}T\d{6}Z-(?:[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?-)?[0-9a-f]{8}"
    r"(\.audit)?(\.\d{1,6})?\.(cast|display)\Z"
)
"""What a recording's file name looks like (`STAMP-[CONSOLE-]ID…`, the console named when it is
not the machine's default one); nothing else is ever opened."""
AUDIT = ".audit"
_LABEL = re.compile(r"\A[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")
_NAME = re.compile(r"\A[^/\x00]{1,253}\Z")
_UID = re.compile(r"\A[0-9A-Za-z][0-9A-Za-z-]{0,63}\Z")
NO_UID = "none"
"""The folder of an object that has no uid (standalone objects may lack one)."""
HEAD = 4096
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class Folder:
    """Where one object's recordings live, as path components beneath `DIR`."""

    namespace: str
    resource: str
    name: str
    uid: str

    @property
    def parts(self) -> tuple[str, ...]:
        """The components, in order."""
        return (self.namespace, self.resource, self.name, self.uid)


def folder(*, namespace: str, resource: str, name: str, uid: str) -> Folder:
    """The folder of an object; `ValueError` (its message for a 400) when a part cannot be one."""
    if not _LABEL.match(namespace):
        raise ValueError(f"{namespace[:64]!r} is not a namespace name (a DNS label)")
    if not _LABEL.match(resource):
        raise ValueError(f"{resource[:64]!r} is not a resource name")
    if not _NAME.match(name) or name in (".", ".."):
        raise ValueError(f"{name[:64]!r} is not an object name (at most 253 characters, no /)")
    return Folder(namespace, resource, name, uid if _UID.match(uid) else NO_UID)


@dataclass(frozen=True)
class RecordingFile:
    """One recording file as found on disk."""

    folder: Folder
    name: str
    size: int
    mtime: float

    @property
    def audit(self) -> bool:
        """Recorded `always`: deleted only by age."""
        return AUDIT in self.name


class RecordingLost(FileNotFoundError):
    """A recording's file or directory is no longer where it was made."""


class Store:
    """The recordings directory, walked without following links."""

    def __init__(self, root: Path) -> None:
        # Resolved once: the configured directory is the operator's; beneath it nothing is.
        self.root = Path(os.path.realpath(root))

    def append(self, where: Folder, name: str, data: bytes) -> int:
        """Append `data` to the file `name` of `where`, made as needed; the new file size."""
        with self._dir(where.parts, create=True) as parent:
            fd = _open(name, os.O_WRONLY | os.O_APPEND | os.O_CREAT, parent)
            try:
                _regular(fd, name)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                return os.fstat(fd).st_size
            finally:
                os.close(fd)

    def files(self, where: Folder) -> list[RecordingFile]:
        """The recordings of `where` (none when it has no folder)."""
        try:
            with self._dir(where.parts) as parent:
                return list(_files(parent, where))
        except FileNotFoundError:
            return []

    def head(self, where: Folder, name: str) -> bytes:
        """The first line (at most `HEAD` bytes) of a recording."""
        with self.open(where, name) as file:
            return file.readline(HEAD)

    def start(self, where: Folder, name: str) -> bytes:
        """The first `HEAD` bytes of a recording (a display's header takes two lines)."""
        with self.open(where, name) as file:
            return file.read(HEAD)

    def opened(self, where: Folder, name: str, flags: int, *, root: tuple[int, int] | None) -> int:
        """A descriptor of the file `name` of `where` (made with `O_CREAT` in `flags`, its
        folders too), reached with no link followed, checked to be a regular file.

        `root`: the directory's identity at start; when it is another now (an
        unmounted volume), `RecordingLost`, and nothing is made.
        """
        with self._dir(where.parts, create=bool(flags & os.O_CREAT), root=root) as parent:
            fd = _open(name, flags, parent)
        try:
            _regular(fd, name)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def located(self, where: Folder, name: str) -> tuple[int, int] | None:
        """Which file `name` of `where` is now (device, inode), or None when there is none."""
        try:
            with self._dir(where.parts) as parent:
                info = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return None
        return info.st_dev, info.st_ino

    def open(self, where: Folder, name: str) -> BinaryIO:
        """A recording opened for reading (the caller closes it); `FileNotFoundError` when
        there is none of that name."""
        if not FILE_NAME.match(name):
            raise FileNotFoundError(errno.ENOENT, "not a recording's name", name)
        with self._dir(where.parts) as parent:
            fd = _open(name, os.O_RDONLY, parent)
        try:
            _regular(fd, name)
        except BaseException:
            os.close(fd)
            raise
        return os.fdopen(fd, "rb")

    def delete(self, recording: RecordingFile) -> None:
        """Remove one recording file (never a link's target: the entry itself)."""
        with self._dir(recording.folder.parts) as parent:
            os.unlink(recording.name, dir_fd=parent)

    def scan(self) -> list[RecordingFile]:
        """Every recording of the current layout."""
        found: list[RecordingFile] = []
        try:
            with self._dir(()) as top:
                for parts in _walk(top, (), depth=4):
                    with self._dir(parts) as parent:
                        found += _files(parent, Folder(*parts))
        except FileNotFoundError:
            pass
        return found

    def legacy(self) -> int:
        """Files of the first layout (`DIR/NAMESPACE/NAME/*.cast`), left alone."""
        count = 0
        with contextlib.suppress(FileNotFoundError), self._dir(()) as top:
            for parts in _walk(top, (), depth=2):
                with self._dir(parts) as parent:
                    count += sum(1 for _ in _entries(parent, stat.S_ISREG, FILE_NAME))
        return count

    @contextlib.contextmanager
    def _dir(
        self, parts: tuple[str, ...], *, create: bool = False, root: tuple[int, int] | None = None
    ) -> Iterator[int]:
        """A descriptor of `DIR/parts…`, reached with no link followed (made with `create`;
        `DIR` itself only when no `root` identity is known)."""
        if create and root is None:
            self.root.mkdir(parents=True, exist_ok=True)
        try:
            current = os.open(self.root, _DIR)
        except FileNotFoundError:
            raise RecordingLost(errno.ENOENT, "the recordings directory is gone") from None
        info = os.fstat(current)
        if root is not None and (info.st_dev, info.st_ino) != root:
            # Never written there: another directory than at start is an unmounted volume.
            os.close(current)
            raise RecordingLost(errno.ENOENT, "the recordings directory is gone")
        try:
            for part in parts:
                if create:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o750, dir_fd=current)
                try:
                    child = os.open(part, _DIR, dir_fd=current)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise FileNotFoundError(errno.ENOENT, "not a directory", part) from None
                    raise
                os.close(current)
                current = child
            yield current
        finally:
            os.close(current)


def _open(name: str, flags: int, parent: int) -> int:
    """A file of the directory `parent`; a link there is as good as no file."""
    try:
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640, dir_fd=parent)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise FileNotFoundError(errno.ENOENT, "a link, not a recording", name) from None
        raise


def _regular(fd: int, name: str) -> None:
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        raise FileNotFoundError(errno.ENOENT, "not a regular file", name)


def _entries(
    parent: int, kind: Callable[[int], bool], pattern: re.Pattern[str] | None
) -> Iterator[os.DirEntry[str]]:
    """Entries of the directory `parent` of a kind (`stat.S_ISDIR`, `S_ISREG`), links never."""
    with os.scandir(parent) as entries:
        for entry in entries:
            if pattern is not None and not pattern.match(entry.name):
                continue
            mode = entry.stat(follow_symlinks=False).st_mode
            if kind(mode):
                yield entry


def _files(parent: int, where: Folder) -> Iterator[RecordingFile]:
    for entry in _entries(parent, stat.S_ISREG, FILE_NAME):
        info = entry.stat(follow_symlinks=False)
        yield RecordingFile(where, entry.name, info.st_size, info.st_mtime)


def _walk(parent: int, parts: tuple[str, ...], *, depth: int) -> Iterator[tuple[str, ...]]:
    """Paths of directories `depth` levels beneath `parent`, links never followed."""
    names = [entry.name for entry in _entries(parent, stat.S_ISDIR, None)]
    for name in names:
        if depth == 1:
            yield (*parts, name)
            continue
        try:
            child = os.open(name, _DIR, dir_fd=parent)
        except OSError:
            continue  # gone meanwhile, or swapped for a link
        try:
            yield from _walk(child, (*parts, name), depth=depth - 1)
        finally:
            os.close(child)
