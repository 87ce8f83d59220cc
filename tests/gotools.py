"""Build the real Kubernetes Go peers in ``tools/`` that the tests talk to.

Each ``tools/<tool>`` is a single-directory Go ``main`` module. ``build`` compiles
it with the machine's ``go`` from the Go module proxy and caches the binary under
``${SUBRES_CACHE:-~/.cache/subres}/bin/<tool>-<key>``, where the key hashes the
module's sources and the link flags, so an unchanged tool is built only once per
machine. Builds hold a file lock: parallel pytest workers wait for one build
instead of racing, and only one Go build runs at a time on the small CI machine.

Some peers are commands of a published module that cannot be imported as a
library, such as KubeVirt's ``virtctl`` (its go.mod points at ``./staging``
directories the module zip leaves out): ``UPSTREAM`` builds those from a copy
of the module with its ``replace`` lines pointed at the published modules.

A cold build of kubectl takes minutes, longer than the default per-test timeout,
so CI should build before pytest starts::

    python -m tests.gotools kubectl kubepeer spdypeer kube-apiserver etcd virtctl \
        kube-controller-manager helm
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
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
# Helm stamps its own release the same way (its Makefile's LDFLAGS); unstamped it says "v4.3".
_HELM_MODULE = "helm.sh/helm/v4"
_HELM_VERSION_PACKAGE = "helm.sh/helm/v4/internal/version"


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


def helm_version(gomod: Path) -> str | None:
    """The Helm release a tool requires, e.g. ``v4.3.2``, or None if it requires none."""
    found = re.search(
        rf"^\s*(?:require\s+)?{re.escape(_HELM_MODULE)}\s+(v\d+\.\d+\.\d+\S*)",
        gomod.read_text(),
        re.MULTILINE,
    )
    return found[1] if found else None


def ldflags(src: Path) -> str:
    """Link flags: no symbol tables (smaller, faster link) and the version stamp."""
    flags = ["-s", "-w"]
    helm = helm_version(src / "go.mod")
    if helm is not None:
        flags += [
            f"-X {_HELM_VERSION_PACKAGE}.version={helm}",
            f"-X {_HELM_VERSION_PACKAGE}.gitTreeState=clean",
        ]
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


def _run_go(args: list[str], cwd: Path, *, mod_flag: bool = True) -> str:
    """Run go; its standard output (its diagnostics go into the error when it fails)."""
    env = dict(os.environ)
    if mod_flag:
        # -mod=mod lets go complete go.sum itself instead of failing on a missing line.
        env["GOFLAGS"] = f"{env.get('GOFLAGS', '')} -mod=mod".strip()
    # A module copied from the module cache may carry a go.work; builds here never use one.
    env["GOWORK"] = "off"
    try:
        # A new session lets a timeout kill go's compiler children too.
        proc = subprocess.Popen(
            args,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
    except FileNotFoundError as exc:
        raise GoBuildError(f"cannot run {args[0]!r}: is Go installed and on PATH?") from exc
    try:
        output, errors = proc.communicate(timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        os.killpg(proc.pid, signal.SIGKILL)
        output, errors = proc.communicate()
        raise GoBuildError(
            f"{' '.join(args)} (in {cwd}) timed out after {BUILD_TIMEOUT_S:.0f}s:\n{output}{errors}"
        ) from exc
    except BaseException:
        # Interrupted (Ctrl-C, pytest-timeout): leave no compiler running behind us.
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    if proc.returncode != 0:
        raise GoBuildError(
            f"{' '.join(args)} (in {cwd}) failed with exit code {proc.returncode}:\n"
            f"{output}{errors}"
        )
    return output


def build(tool: str) -> Path:
    """Build ``tools/<tool>`` (or the ``UPSTREAM`` command of that name) if needed."""
    if tool in UPSTREAM:
        return build_upstream(UPSTREAM[tool])
    src = TOOLS / tool
    if not (src / "go.mod").is_file():
        raise GoBuildError(f"no Go module at {src}")
    flags = ldflags(src)
    with _building(f"{tool}-{source_key(src, flags)}") as partial:
        if partial is not None:
            args = ["go", "build", "-trimpath", "-buildvcs=false", "-ldflags", flags]
            _run_go([*args, "-o", str(partial), "."], cwd=src)
    return _target(f"{tool}-{source_key(src, flags)}")


def _target(name: str) -> Path:
    return cache_dir() / "bin" / name


@contextlib.contextmanager
def _building(name: str) -> Iterator[Path | None]:
    """Where to write the binary `name`, or None when it is cached already.

    The body builds into the path given; on success it becomes the cached binary.
    """
    target = _target(name)
    if _is_executable(target):
        yield None
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    # One lock for every tool: besides stopping two workers building the same
    # binary, it keeps to one Go build at a time on a 2-core machine.
    with (target.parent / ".build.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _is_executable(target):  # another worker built it while we waited
            yield None
            return
        # Build beside the target and rename, so no one ever sees half a binary.
        partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
        try:
            yield partial
            partial.replace(target)
        finally:
            partial.unlink(missing_ok=True)


@dataclass(frozen=True)
class Upstream:
    """A command built from the source tree of a published module at a pinned version."""

    module: str
    version: str
    package: str
    """The command's package, relative to the module root."""
    replace: tuple[tuple[str, str], ...]
    """(module, version): replace lines of the module's go.mod to point at these instead."""
    version_package: str
    """Package whose gitVersion/gitCommit/gitTreeState/buildDate the release stamps."""

    def key(self) -> str:
        """Hash of the recipe: a new version or replacement makes a new binary."""
        return hashlib.sha256(repr(self).encode()).hexdigest()[:16]


UPSTREAM = {
    # KubeVirt's go.mod replaces its api and client-go with ./staging directories that the
    # module zip does not contain; the published modules of the same release are those trees.
    "virtctl": Upstream(
        module="kubevirt.io/kubevirt",
        version="v1.7.0",
        package="./cmd/virtctl",
        replace=(("kubevirt.io/api", "v1.7.0"), ("kubevirt.io/client-go", "v1.7.0")),
        version_package="kubevirt.io/client-go/version",
    ),
}


def build_upstream(recipe: Upstream) -> Path:
    """Build `recipe` once: download the module, copy it, re-point its replaces, build."""
    name = f"{recipe.package.rsplit('/', 1)[-1]}-{recipe.key()}"
    with _building(name) as partial:
        if partial is not None:
            with tempfile.TemporaryDirectory(prefix="subres-upstream-") as scratch:
                _build_copy(recipe, Path(scratch), partial)
    return _target(name)


def _build_copy(recipe: Upstream, scratch: Path, out: Path) -> None:
    # The proxy serves exact versions even where it refuses to list them.
    info = json.loads(
        _run_go(
            ["go", "mod", "download", "-json", f"{recipe.module}@{recipe.version}"],
            cwd=scratch,
            mod_flag=False,
        )
    )
    src = scratch / "src"
    shutil.copytree(info["Dir"], src)
    for path in [src, *src.rglob("*")]:  # the module cache is read-only
        path.chmod(path.stat().st_mode | 0o200)
    for work in ("go.work", "go.work.sum"):
        (src / work).unlink(missing_ok=True)
    edits = [f"-replace={mod}={mod}@{version}" for mod, version in recipe.replace]
    _run_go(["go", "mod", "edit", *edits], cwd=src)
    origin = info.get("Origin") or {}
    stamp = {
        "gitVersion": recipe.version,
        "gitCommit": origin.get("Hash", ""),
        "gitTreeState": "clean",
        "buildDate": _info_time(Path(info["Info"])),
    }
    flags = " ".join(
        ["-s", "-w", *(f"-X {recipe.version_package}.{k}={v}" for k, v in stamp.items())]
    )
    args = ["go", "build", "-trimpath", "-buildvcs=false", "-ldflags", flags]
    _run_go([*args, "-o", str(out), recipe.package], cwd=src)


def _info_time(path: Path) -> str:
    """The release's commit time from the proxy's .info file (a stable build date)."""
    with contextlib.suppress(OSError, ValueError):
        return str(json.loads(path.read_text()).get("Time", ""))
    return ""


def kubectl() -> Path:
    """Our kubectl, built from the pinned k8s.io/kubectl module (never the one on PATH)."""
    return build("kubectl")


def kubepeer() -> Path:
    """The client-go port-forward/exec peer in tools/kubepeer."""
    return build("kubepeer")


def helm() -> Path:
    """Helm v4 at the release tools/helm pins, for deploy/chart."""
    return build("helm")


def virtctl() -> Path:
    """KubeVirt's virtctl at the release `UPSTREAM` pins, unmodified."""
    return build("virtctl")


@pytest.fixture(scope="session")
def kubectl_bin() -> Path:
    return kubectl()


@pytest.fixture(scope="session")
def kubepeer_bin() -> Path:
    return kubepeer()


@pytest.fixture(scope="session")
def helm_bin() -> Path:
    return helm()


@pytest.fixture(scope="session")
def virtctl_bin() -> Path:
    return virtctl()


def main(argv: list[str]) -> int:
    """Build the named tools (all in tools/ when none is named), printing their paths."""
    tools = argv or sorted([*(p.parent.name for p in TOOLS.glob("*/go.mod")), *UPSTREAM])
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
