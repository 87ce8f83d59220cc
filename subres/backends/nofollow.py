"""Unix sockets reached without following a link at any step, and only when their owner is right.

A node agent dials sockets in directories others write: a VM's launcher
creates them there, and a compromised launcher or guest runtime may put
anything in their place. A path resolved and then dialed by name can be
swapped in between (KubeVirt's CVE-2026-7374: a console socket replaced by a
symlink to the CRI socket). So the path is opened, never resolved by name:

1. the socket directory (its real path, fixed when the agent starts) is
   opened with `openat2(RESOLVE_NO_SYMLINKS)`, and the rest of the path
   beneath that descriptor with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
   RESOLVE_NO_MAGICLINKS`, `O_PATH | O_NOFOLLOW`. Where openat2 is missing
   (kernels before 5.6, seccomp profiles that refuse it) each component is
   opened from the previous one's descriptor with `O_PATH | O_NOFOLLOW`
   (`O_DIRECTORY` but for the last), which follows no link either;
2. the descriptor must be a socket. `O_PATH | O_NOFOLLOW` on a symlink opens
   the link itself, and a connect through `/proc/self/fd/N` would then follow
   it after all (CVE-2026-13201's trick). A socket inode is never a link, and
   a descriptor keeps its inode whatever later happens to the path;
3. the socket file must belong to the directory's configured owner (the
   uid, and the gid when one is configured, of whoever bound it);
4. the connection goes through `/proc/self/fd/N`, first checked to lead to
   that very inode (it would not if /proc were not the process's procfs);
5. once connected, the listener's credentials (SO_PEERCRED: the process
   that listened) must be the owner's too; otherwise the connection is closed
   before a byte is sent.

Steps 1 to 3 run in a worker thread (they touch the filesystem); nothing here
parses URLs or knows policy beyond the directories and their owners.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import os
import platform
import socket
import stat
import struct
from dataclasses import dataclass

from subres.backends.stream import BackendUnavailable
from subres.engine.sockets import SocketStream

__all__ = ["SocketDir", "SocketRefused", "dial", "locate", "open_socket"]

RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
SYS_OPENAT2 = 437
"""openat2's number in the table every architecture shares since Linux 5.6."""
OPENAT2_ARCHES = frozenset({"x86_64", "aarch64", "arm64", "i686", "armv7l", "ppc64le", "s390x"})
PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
AT_FDCWD = -100
_CRED = struct.Struct("3i")
_LIBC = ctypes.CDLL(None, use_errno=True)


class SocketRefused(Exception):
    """The path or the socket it holds is not one the agent may dial (a 403)."""


@dataclass(frozen=True)
class SocketDir:
    """A directory whose sockets may be dialed, and who must own them."""

    path: str
    """As configured (normalised): requests name sockets by it."""
    real: str
    """Its real path, opened at every dial with no link followed."""
    uid: int
    """The owner every socket (file and listener) must have."""
    gid: int | None = None
    """When set, the group they must have too."""

    def owner(self) -> str:
        """`uid 107` or `uid 107, gid 107`."""
        return f"uid {self.uid}" + ("" if self.gid is None else f", gid {self.gid}")


def locate(path: str, dirs: tuple[SocketDir, ...]) -> tuple[SocketDir, str]:
    """The directory `path` lies in and the path beneath it, read as written, never resolved."""
    parts = path.split("/")
    if not path.startswith("/") or any(p in ("", ".", "..") for p in parts[1:]):
        raise SocketRefused(f"socket {path} is not a plain absolute path")
    for directory in dirs:
        for root in (directory.path, directory.real):
            if path.startswith(root.rstrip("/") + "/"):
                return directory, path[len(root.rstrip("/")) + 1 :]
    raise SocketRefused(f"socket {path} is outside the allowed directories")


def open_socket(directory: SocketDir, relative: str) -> int:
    """An `O_PATH` descriptor of the socket at `relative` beneath `directory`, owner checked."""
    shown = f"{directory.path}/{relative}"
    root = _open(AT_FDCWD, directory.real, PATH_FLAGS | os.O_DIRECTORY, shown)
    try:
        fd = _open(root, relative, PATH_FLAGS, shown)
    finally:
        os.close(root)
    try:
        _check_file(fd, directory, shown)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_file(fd: int, directory: SocketDir, shown: str) -> None:
    info = os.fstat(fd)
    if stat.S_ISLNK(info.st_mode):
        raise SocketRefused(f"socket {shown} is a symbolic link")
    if not stat.S_ISSOCK(info.st_mode):
        raise SocketRefused(f"{shown} is not a socket")
    _check_owner(info.st_uid, info.st_gid, directory, f"socket {shown} belongs to")


def _check_owner(uid: int, gid: int, directory: SocketDir, what: str) -> None:
    if uid != directory.uid or directory.gid not in (None, gid):
        raise SocketRefused(
            f"{what} uid {uid}, gid {gid}; {directory.path} allows {directory.owner()} only"
        )


class _Openat2:
    """Whether to try openat2: until it turns out missing or forbidden here."""

    works = platform.system() == "Linux" and platform.machine() in OPENAT2_ARCHES


def _open(dirfd: int, path: str, flags: int, shown: str) -> int:
    """`path` opened from `dirfd` following no link (beneath `dirfd` unless it is AT_FDCWD)."""
    if _Openat2.works:
        resolve = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS
        try:
            return _openat2(dirfd, path, flags, resolve | (RESOLVE_BENEATH if dirfd >= 0 else 0))
        except OSError as exc:
            if exc.errno not in (errno.ENOSYS, errno.EPERM):
                raise _refusal(exc, shown) from None
            _Openat2.works = False  # not on this kernel, or not allowed here: walk instead
    try:
        return _walk(dirfd, path, flags)
    except OSError as exc:
        raise _refusal(exc, shown) from None


def _openat2(dirfd: int, path: str, flags: int, resolve: int) -> int:
    how = (ctypes.c_uint64 * 3)(flags, 0, resolve)  # struct open_how: flags, mode, resolve
    fd = int(
        _LIBC.syscall(
            ctypes.c_long(SYS_OPENAT2),
            ctypes.c_long(dirfd),
            ctypes.c_char_p(os.fsencode(path)),
            ctypes.byref(how),
            ctypes.c_long(ctypes.sizeof(how)),
        )
    )
    if fd < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), path)
    return fd


def _walk(dirfd: int, path: str, flags: int) -> int:
    """One component at a time, each opened from the last with O_NOFOLLOW."""
    parts = [p for p in path.split("/") if p]
    current = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) if dirfd < 0 else dirfd
    try:
        for index, name in enumerate(parts):
            last = index == len(parts) - 1
            opened = os.open(name, flags if last else PATH_FLAGS | os.O_DIRECTORY, dir_fd=current)
            if current != dirfd:
                os.close(current)
            current = opened
    except BaseException:
        if current != dirfd:
            os.close(current)
        raise
    return current


def _refusal(exc: OSError, shown: str) -> Exception:
    """A link or an escape on the way is a refusal; anything else (no such file) an OSError."""
    if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EXDEV):
        return SocketRefused(f"socket {shown}: a symbolic link or a non-directory on the way")
    return exc


async def dial(
    path: str,
    dirs: tuple[SocketDir, ...],
    *,
    connect_timeout: float,
    read_size: int,
    write_timeout: float,
) -> SocketStream:
    """A `SocketStream` to the socket at `path`, reached and checked as the module says.

    `SocketRefused` when the path or its socket is not allowed; `BackendUnavailable`
    when it cannot be reached (missing, refused, timed out).
    """
    directory, relative = locate(path, dirs)
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(connect_timeout):
            fd = await asyncio.to_thread(open_socket, directory, relative)
            try:
                sock = await _connect(fd, directory, path)
            finally:
                os.close(fd)
            _, stream = await loop.create_unix_connection(
                lambda: SocketStream(high_water=4 * read_size, write_timeout=write_timeout),
                sock=sock,
            )
    except TimeoutError:
        raise BackendUnavailable(f"connecting to unix://{path} timed out") from None
    except OSError as exc:
        raise BackendUnavailable(
            f"cannot connect to unix://{path}: {exc.strerror or exc}"
        ) from None
    return stream


async def _connect(fd: int, directory: SocketDir, path: str) -> socket.socket:
    """Connect through `/proc/self/fd/N`, then check who listens there."""
    via = f"/proc/self/fd/{fd}"
    opened, reached = os.fstat(fd), os.stat(via)
    if (opened.st_dev, opened.st_ino) != (reached.st_dev, reached.st_ino):
        raise SocketRefused(f"{via} does not lead to the socket opened for {path}")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, via)
        _, uid, gid = _CRED.unpack(
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size)
        )
        _check_owner(uid, gid, directory, f"the listener on {path} runs as")
    except BaseException:
        sock.close()
        raise
    return sock
