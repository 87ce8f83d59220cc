"""The real cluster's cgroups (v1 and hybrid hosts): one subtree it owns, in every hierarchy.

Everything a node runs lives under ``<base>/subres-cluster/<node>``: the
node's own programs (containerd, its shims, the kubelet, kube-proxy) in
``daemons``, and the pods under the kubelet's ``cgroupRoot``, the node's
directory itself. ``<base>`` is this process's own memory cgroup, so the
cluster is accounted where the test run is. Tearing down kills every process
found in the subtree (all of them started by us, directly or through
containerd and the kubelet) and removes the directories.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from tests.cluster import hoststate

__all__ = ["base", "create", "kill_all", "move", "pids", "remove"]

NAME = "subres-cluster"


def base() -> str:
    """The cgroup path the cluster's subtree goes under: this process's memory cgroup."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return path
    return "/"


def create(path: str) -> None:
    """Make `path` (and its parents) in every hierarchy; cpusets get their parent's CPUs."""
    for mount in hoststate.cgroup_mounts():
        parts = Path(path.lstrip("/")).parts
        for depth in range(1, len(parts) + 1):
            directory = Path(mount, *parts[:depth])
            if directory.is_dir():
                continue
            directory.mkdir()
            # A new v1 cpuset is empty and takes no task until given CPUs and memory nodes.
            for name in ("cpuset.cpus", "cpuset.mems"):
                own, parent = directory / name, directory.parent / name
                if own.exists() and not own.read_text().strip():
                    own.write_text(parent.read_text())


def move(pid: int, path: str) -> None:
    """Put process `pid` into `path` in every hierarchy (its children follow it)."""
    for mount in hoststate.cgroup_mounts():
        procs = Path(mount, path.lstrip("/"), "cgroup.procs")
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            procs.write_text(str(pid))


def pids(path: str) -> set[int]:
    """Every process in `path` or below it, in any hierarchy."""
    found: set[int] = set()
    for mount in hoststate.cgroup_mounts():
        for directory, _, files in os.walk(Path(mount, path.lstrip("/"))):
            if "cgroup.procs" in files:
                with contextlib.suppress(OSError):
                    text = Path(directory, "cgroup.procs").read_text()
                    found.update(int(p) for p in text.split())
    return found


def kill_all(path: str, *, timeout_s: float = 10.0) -> set[int]:
    """SIGKILL every process under `path` until none is left; the PIDs killed."""
    killed: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while (left := pids(path)) and time.monotonic() < deadline:
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        killed |= left
        time.sleep(0.05)  # the kernel empties cgroup.procs as it reaps them
    return killed


def remove(path: str) -> list[str]:
    """rmdir `path` and everything below it in every hierarchy; what could not be removed."""
    problems = []
    for mount in hoststate.cgroup_mounts():
        root = Path(mount, path.lstrip("/"))
        if not root.is_dir():
            continue
        for directory, _, _ in sorted(os.walk(root), key=lambda w: len(w[0]), reverse=True):
            try:
                Path(directory).rmdir()
            except OSError as exc:
                problems.append(f"{directory}: {exc}")
    return problems
