"""One demo per state directory, and what the running one says about itself.

A demo holds an exclusive `flock` on `STATE/demo.lock` for as long as it
runs (the kernel drops it when the process ends, however it ends) and writes
there, once it serves, where it serves. A second `subres demo` on the same
directory takes the lock first, before it writes anything: when the lock is
held it reads that note and refuses, saying how to reach the running demo,
so the first demo's machines file, sockets and certificates stay untouched.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path

__all__ = ["Claim", "DemoRunning", "claim"]

LOCK = "demo.lock"


class DemoRunning(Exception):
    """Another demo runs on this state directory; the message says how to reach it."""


class Claim:
    """The lock a running demo holds; `announce` tells later demos where it serves."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def announce(self, *, url: str, kubeconfig: Path) -> None:
        """Record where this demo serves, for a second demo's refusal to quote."""
        note = json.dumps({"pid": os.getpid(), "url": url, "kubeconfig": str(kubeconfig)})
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, note.encode(), 0)


@contextlib.contextmanager
def claim(state_dir: Path) -> Iterator[Claim]:
    """Hold `state_dir` for this demo; `DemoRunning` when another demo holds it."""
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = state_dir / LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            raise DemoRunning(_refusal(state_dir, os.pread(fd, 4096, 0))) from None
        # A note left by a demo that died is not ours to quote while we start.
        os.ftruncate(fd, 0)
        yield Claim(fd)
    finally:
        os.close(fd)


def _refusal(state_dir: Path, note: bytes) -> str:
    try:
        running = json.loads(note)
    except ValueError:
        running = {}
    if not isinstance(running, dict) or "url" not in running:
        return (
            f"a demo is already starting in {state_dir}; "
            "wait for it, stop it, or pass another --state-dir"
        )
    kubeconfig = running.get("kubeconfig", state_dir / "kubeconfig")
    return (
        f"a demo is already running in {state_dir} (pid {running.get('pid')}, "
        f"{running['url']}); reach it with\n"
        f"  subres --kubeconfig {kubeconfig} console demo\n"
        "or stop it first (Ctrl+C where it runs), or pass another --state-dir"
    )
