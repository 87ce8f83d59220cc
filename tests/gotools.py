"""Build the real Kubernetes Go peers in ``tools/`` that the tests talk to.

Each ``tools/<tool>`` is a single-directory Go ``main`` module. ``build`` compiles
it with the machine's ``go`` from the Go module proxy and caches the binary under
``${SUBRES_CACHE:-~/.cache/subres}/bin/<tool>-<key>``, where the key hashes the
module's sources and the link flags, so an unchanged tool is built only once per
machine. Builds hold a file lock: parallel pytest workers wait for one build
instead of racing, and only one Go build runs at a time on the small CI machine.

A cold build of kubectl takes minutes, longer than the default per-test timeout,
so CI should build before pytest starts::

    python -m tests.gotools kubectl kubepeer spdypeer kube-apiserver etcd
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TOOLS = REPO / "tools"

# A cold kubectl build (module download plus compiling ~1000 packages) takes
# several minutes on 2 cores, kube-apiserver about nine on a busy machine;
# leave ample room.
BUILD_TIMEOUT_S = 1800.0

# Kubernetes releases stamp these packages at link time; a module build would
# otherwise report "v0.0.0-master", which is not the version we pinned.
_VERSION_PACKAGES = ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
# The module whose version a tool reports, first found in its go.mod wins.
# k8s.io/kubernetes carries the release tag itself; the others are staging modules.
_VERSION_MODULES = ("k8s.io/kubernetes", "k8s.io/kubectl", "k8s.io/client-go")


class GoBuildError(RuntimeError):
    """A Go tool could not be built; the message carries go's output."""


def cache_dir() -> Path:
    """Where built binaries live: ``$SUBRES_CACHE`` or ``~/.cache/subres``."""
    root = os.environ.get("SUBRES_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "subres"


def kube_version(gomod: Path) -> str | None:
    """The Kubernetes release matching the tool's k8s.io module, e.g. ``v1.37.2``.

    ``k8s.io/kubernetes`` is tagged with the release itself; published staging
    modules are tagged ``v0.Y.Z`` for Kubernetes ``v1.Y.Z``.
    """
    text = gomod.read_text()
    for module in _VERSION_MODULES:
        found = re.search(
            rf"^\s*(?:require\s+)?{re.escape(module)}\s+v([01])\.(\d+)\.(\d+)(\S*)",
            text,
            re.MULTILINE,
        )
        # v0.0.x is a pseudo-version of an untagged commit (or a staging module
        # that k8s.io/kubernetes requires as v0.0.0): no release to claim.
        if found and found[2] != "0":
            return f"v1.{found[2]}.{found[3]}{found[4]}"
    return None


def ldflags(src: Path) -> str:
    """Link flags: no symbol tables (smaller, faster link) and the version stamp."""
    flags = ["-s", "-w"]
    version = kube_version(src / "go.mod")
    if version is not None:
        minor = version.split(".")[1]
        for pkg in _VERSION_PACKAGES:
            flags += [
                f"-X {pkg}.gitVersion={version}",
                f"-X {pkg}.gitMajor=1",
                f"-X {pkg}.gitMinor={minor}",
            ]
    return " ".join(flags)


def source_key(src: Path, flags: str) -> str:
    """First 16 hex digits of a sha256 over go.mod, go.sum, the *.go files and the flags."""
    digest = hashlib.sha256()
    files = [src / "go.mod", src / "go.sum", *sorted(src.glob("*.go"))]
    for path in files:
        if path.is_file():
            # Names delimit the contents so moving code between files changes the key.
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(flags.encode())
    return digest.hexdigest()[:16]


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _run_go(args: list[str], cwd: Path) -> None:
    env = dict(os.environ)
    # -mod=mod lets go complete go.sum itself instead of failing on a missing line.
    env["GOFLAGS"] = f"{env.get('GOFLAGS', '')} -mod=mod".strip()
    try:
        # A new session lets a timeout kill go's compiler children too.
        proc = subprocess.Popen(
            args,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
    except FileNotFoundError as exc:
        raise GoBuildError(f"cannot run {args[0]!r}: is Go installed and on PATH?") from exc
    try:
        output, _ = proc.communicate(timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        raise GoBuildError(
            f"{' '.join(args)} (in {cwd}) timed out after {BUILD_TIMEOUT_S:.0f}s:\n{output}"
        ) from exc
    except BaseException:
        # Interrupted (Ctrl-C, pytest-timeout): leave no compiler running behind us.
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    if proc.returncode != 0:
        raise GoBuildError(
            f"{' '.join(args)} (in {cwd}) failed with exit code {proc.returncode}:\n{output}"
        )


def build(tool: str) -> Path:
    """Build ``tools/<tool>`` if needed and return the cached binary's path."""
    src = TOOLS / tool
    if not (src / "go.mod").is_file():
        raise GoBuildError(f"no Go module at {src}")
    flags = ldflags(src)
    bindir = cache_dir() / "bin"
    target = bindir / f"{tool}-{source_key(src, flags)}"
    if _is_executable(target):
        return target
    bindir.mkdir(parents=True, exist_ok=True)
    # One lock for every tool: besides stopping two workers building the same
    # binary, it keeps to one Go build at a time on a 2-core machine.
    with (bindir / ".build.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _is_executable(target):  # another worker built it while we waited
            return target
        # Build beside the target and rename, so no one ever sees half a binary.
        partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
        try:
            args = ["go", "build", "-trimpath", "-buildvcs=false", "-ldflags", flags]
            _run_go([*args, "-o", str(partial), "."], cwd=src)
            partial.replace(target)
        finally:
            partial.unlink(missing_ok=True)
    return target


def kubectl() -> Path:
    """Our kubectl, built from the pinned k8s.io/kubectl module (never the one on PATH)."""
    return build("kubectl")


def kubepeer() -> Path:
    """The client-go port-forward/exec peer in tools/kubepeer."""
    return build("kubepeer")


@pytest.fixture(scope="session")
def kubectl_bin() -> Path:
    return kubectl()


@pytest.fixture(scope="session")
def kubepeer_bin() -> Path:
    return kubepeer()


def main(argv: list[str]) -> int:
    """Build the named tools (all in tools/ when none is named), printing their paths."""
    tools = argv or sorted(p.parent.name for p in TOOLS.glob("*/go.mod"))
    for tool in tools:
        started = time.monotonic()
        try:
            path = build(tool)
        except GoBuildError as exc:
            print(exc, file=sys.stderr)
            return 1
        print(f"{path}\t{time.monotonic() - started:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
