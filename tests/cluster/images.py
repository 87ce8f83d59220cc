"""The images the real cluster runs, built by ``deploy/image/build.py`` and cached.

- ``subres(tag, variant)``: the subres image from ``deploy/image/subres.json``
  and this checkout's sources, as ``localhost/subres:<tag>``. Variants differ
  in a label only: two independent builds, whose layers must be the same
  bytes (the build is reproducible) while the images differ (a rolling
  upgrade goes from one to the other).
- ``pause()``: the pod sandbox, ``tools/pause`` alone in a layer.
- ``qemu_vm()``: Debian's QEMU and busybox with ``examples/qemu-vm/run-vm.sh``
  and the kernel it prepared (``run-vm.sh prepare``), running the VM in the
  foreground.

An archive is kept in ``${SUBRES_CACHE:-~/.cache/subres}/images`` under a
key hashing everything it is built from, like ``tests.gotools`` keeps Go
binaries; builds hold a file lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests import gotools

__all__ = ["BuiltImage", "ImageError", "pause", "qemu_vm", "subres"]

REPO = Path(__file__).resolve().parents[2]
BUILDER = REPO / "deploy" / "image" / "build.py"
RECIPES = Path(__file__).resolve().parent / "images"
EPOCH = 1700000000
"""Timestamps in the test images: fixed, so that a new commit alone rebuilds nothing."""
BUILD_TIMEOUT_S = 1200.0
# What the subres image is made of, besides the builder and the recipe.
SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "package.json", "package-lock.json")


class ImageError(RuntimeError):
    """An image could not be built; carries the builder's output."""


@dataclass(frozen=True)
class BuiltImage:
    """An OCI archive in the cache and what the builder said of it."""

    path: Path
    name: str
    digest: str
    layer: str


def subres(tag: str, variant: str) -> BuiltImage:
    """``localhost/subres:<tag>`` from this checkout, labelled ``dev.subres.test=<variant>``."""
    recipe = REPO / "deploy" / "image" / "subres.json"
    files = [recipe, *sorted((REPO / "deploy" / "image").glob("*.txt"))]
    files += [REPO / name for name in SOURCES]
    files += sorted(
        p
        for p in (REPO / "subres").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and "vendor" not in p.parts
    )
    return _build(recipe, tag=tag, files=files, labels={"dev.subres.test": variant})


def pause() -> Path:
    """The sandbox image, ``localhost/subres-test/pause:1``."""
    binary = gotools.build("pause")
    recipe = RECIPES / "pause.json"
    return _build(recipe, tag="1", files=[recipe, binary], copies=[(binary, "/pause")]).path


def qemu_vm() -> BuiltImage:
    """``localhost/subres-test/qemu-vm:1``: the example VM, run by ``run-vm.sh run``."""
    script = REPO / "examples" / "qemu-vm" / "run-vm.sh"
    kernel = _prepared_kernel(script)
    recipe = RECIPES / "qemu-vm.json"
    return _build(
        recipe,
        tag="1",
        files=[recipe, script, *sorted(p for p in kernel.rglob("*") if p.is_file())],
        copies=[(script, "/usr/local/bin/run-vm.sh"), (kernel, "/var/cache/qemu-vm/current")],
    )


def _prepared_kernel(script: Path) -> Path:
    """The kernel directory ``run-vm.sh prepare`` unpacked (it runs it when missing)."""
    cache = gotools.cache_dir() / "qemu-vm"
    if not (cache / "current" / "vmlinux").is_file():
        _run(["bash", str(script), "prepare"])
    return (cache / "current").resolve()


def _build(
    recipe: Path,
    *,
    tag: str,
    files: Sequence[Path],
    copies: Sequence[tuple[Path, str]] = (),
    labels: dict[str, str] | None = None,
) -> BuiltImage:
    key = _key([BUILDER, *files], f"{tag} {copies} {labels} {EPOCH}")
    stem = f"{json.loads(recipe.read_text())['name'].rsplit('/', 1)[-1]}-{tag}-{key}"
    archive = gotools.cache_dir() / "images" / f"{stem}.oci.tar"
    about = archive.with_suffix(".json")
    with _locked(archive.parent):
        if not about.is_file():
            args = [
                sys.executable,
                str(BUILDER),
                "--recipe",
                str(recipe),
                "--tag",
                tag,
                "--epoch",
                str(EPOCH),
                "--out",
                str(archive),
            ]
            args += [f"--copy={src}={dest}" for src, dest in copies]
            args += [f"--label={k}={v}" for k, v in (labels or {}).items()]
            about.write_text(_run(args))
    built = json.loads(about.read_text())
    return BuiltImage(Path(built["path"]), built["name"], built["digest"], built["layer"])


def _key(files: Sequence[Path], extra: str) -> str:
    digest = hashlib.sha256(extra.encode())
    for path in files:
        name = path.relative_to(REPO) if path.is_relative_to(REPO) else Path(path.name)
        digest.update(str(name).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / ".build.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _run(args: Sequence[str]) -> str:
    proc = subprocess.run(
        args,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    if proc.returncode != 0:
        raise ImageError(f"{' '.join(args)} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
    return proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
