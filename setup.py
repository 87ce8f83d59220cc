"""Build step for the browser page: its third-party JavaScript, with Python alone.

`package.json` and `package-lock.json` pin xterm.js, its fit addon, noVNC and
asciinema-player (its self-contained bundle: the recordings page); the lock
names each package's tarball (`resolved`) and its sha512 (`integrity`).
`build_py` puts only the files the page loads (with their licences) into
`subres/web/static/vendor/`, taking each package from the first of:

1. a vendored copy already there from the same lock (an sdist carries one, so
   a wheel built from it needs no network; `VENDORED_FROM` records the lock's
   hashes it came from);
2. `node_modules/` when `npm ci` has run and installed the locked version;
3. the tarball in `${SUBRES_CACHE:-~/.cache/subres}/npm/`, or downloaded from
   the lock's URL into it; every tarball is checked against the lock's sha512
   before a byte of it is used.

No Node.js and no npm are needed. Offline with none of these, the build stops
with one line saying what is missing and where to put it. Regular builds
write into the build directory (wheels carry the files), sdists into their
release tree, editable installs into the source tree (git-ignored).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

ROOT = Path(__file__).resolve().parent
VENDOR = Path("subres", "web", "static", "vendor")
STAMP = "VENDORED_FROM"
FILES = {
    "xterm/xterm.mjs": "@xterm/xterm/lib/xterm.mjs",
    "xterm/xterm.css": "@xterm/xterm/css/xterm.css",
    "xterm/LICENSE": "@xterm/xterm/LICENSE",
    "addon-fit/addon-fit.mjs": "@xterm/addon-fit/lib/addon-fit.mjs",
    "addon-fit/LICENSE": "@xterm/addon-fit/LICENSE",
    "novnc/LICENSE.txt": "@novnc/novnc/LICENSE.txt",
    "asciinema-player/asciinema-player.min.js": (
        "asciinema-player/dist/bundle/asciinema-player.min.js"
    ),
    "asciinema-player/asciinema-player.css": "asciinema-player/dist/bundle/asciinema-player.css",
    "asciinema-player/LICENSE": "asciinema-player/LICENSE",
}
TREES = {
    # noVNC's ES modules import pako from ../vendor, so the two keep their layout.
    "novnc/core": "@novnc/novnc/core",
    "novnc/vendor/pako": "@novnc/novnc/vendor/pako",
}
DOWNLOAD_TIMEOUT_S = 60.0


class AssetError(SystemExit):
    """The page's files cannot be had; the message is the one line the user sees."""


@dataclass(frozen=True)
class Package:
    """One locked npm package the page takes files from."""

    name: str
    version: str
    url: str
    integrity: str
    """Subresource-integrity string, ``sha512-<base64>``."""

    def verify(self, data: bytes) -> bool:
        algorithm, _, expected = self.integrity.partition("-")
        if algorithm != "sha512":
            raise AssetError(f"error: {self.name}: the lock's integrity is not sha512")
        return base64.b64encode(hashlib.sha512(data).digest()).decode() == expected


def locked_packages(root: Path = ROOT) -> dict[str, Package]:
    """The lock's entries of the packages FILES and TREES take files from."""
    lock = json.loads((root / "package-lock.json").read_text())["packages"]
    packages = {}
    for source in [*FILES.values(), *TREES.values()]:
        name = _package_of(source)
        entry = lock[f"node_modules/{name}"]
        packages[name] = Package(name, entry["version"], entry["resolved"], entry["integrity"])
    return packages


def _package_of(source: str) -> str:
    parts = source.split("/")
    return "/".join(parts[:2] if parts[0].startswith("@") else parts[:1])


def vendor_web_assets(target: Path, *, root: Path = ROOT, cache: Path | None = None) -> None:
    """Put the files the page loads into `target`, from the lock's packages."""
    packages = locked_packages(root)
    stamp = json.dumps({p.name: p.integrity for p in packages.values()}, indent=1, sort_keys=True)
    if _read(target / STAMP) == stamp:
        return
    vendored = root / VENDOR
    if vendored != target and _read(vendored / STAMP) == stamp:
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(vendored, target)
        return
    contents = {name: _contents(p, root, cache or _cache_dir()) for name, p in packages.items()}
    shutil.rmtree(target, ignore_errors=True)
    for dest, source in FILES.items():
        _write(target / dest, contents[_package_of(source)].file(source))
    for dest, source in TREES.items():
        for relative, data in contents[_package_of(source)].tree(source):
            if not relative.endswith(".md"):
                _write(target / dest / relative, data)
    (target / STAMP).write_text(stamp)


class _Contents:
    """Reads one package's files by their ``<name>/<path>`` names, from a directory or a tarball."""

    def __init__(self, package: Package, *, directory: Path | None, tarball: bytes | None):
        self._prefix = package.name + "/"
        self._directory = directory
        self._members: dict[str, bytes] = {}
        if tarball is not None:
            self._members = _regular_files(tarball)

    def _relative(self, source: str) -> str:
        return source.removeprefix(self._prefix)

    def file(self, source: str) -> bytes:
        relative = self._relative(source)
        if self._directory is not None:
            return (self._directory / relative).read_bytes()
        return self._members[relative]

    def tree(self, source: str) -> list[tuple[str, bytes]]:
        top = self._relative(source)
        if self._directory is not None:
            base = self._directory / top
            return [
                (path.relative_to(base).as_posix(), path.read_bytes())
                for path in sorted(base.rglob("*"))
                if path.is_file()
            ]
        return [
            (name.removeprefix(top + "/"), data)
            for name, data in sorted(self._members.items())
            if name.startswith(top + "/")
        ]


def _contents(package: Package, root: Path, cache: Path) -> _Contents:
    installed = root / "node_modules" / package.name
    if _read(installed / "package.json") is not None:
        if json.loads((installed / "package.json").read_text()).get("version") == package.version:
            return _Contents(package, directory=installed, tarball=None)
    return _Contents(package, directory=None, tarball=_tarball(package, cache))


def _tarball(package: Package, cache: Path) -> bytes:
    """The package's verified tarball, from the cache or downloaded into it."""
    kept = cache / package.url.rsplit("/", 1)[-1]
    if kept.is_file() and package.verify(data := kept.read_bytes()):
        return data
    try:
        with urllib.request.urlopen(package.url, timeout=DOWNLOAD_TIMEOUT_S) as answer:
            data = answer.read()
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise AssetError(
            f"error: building subres needs {package.name} {package.version} for the browser page "
            f"and cannot download {package.url} ({reason}); build from subres's sdist, which "
            f"carries it, or put that file at {kept}"
        ) from None
    if not package.verify(data):
        raise AssetError(
            f"error: {package.url} does not match package-lock.json's integrity; not using it"
        )
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=cache, delete=False) as partial:
        partial.write(data)
    Path(partial.name).chmod(0o644)
    Path(partial.name).replace(kept)
    return data


def _regular_files(tarball: bytes) -> dict[str, bytes]:
    """An npm tarball's regular files by their path under its top directory (`package/`)."""
    files = {}
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as archive:
        for member in archive:
            path = PurePosixPath(member.name)
            # Only plain files under the top directory: no links, no '..', no absolute paths.
            if not member.isfile() or path.is_absolute() or ".." in path.parts:
                continue
            relative = PurePosixPath(*path.parts[1:]).as_posix()
            extracted = archive.extractfile(member)
            if extracted is not None and relative != ".":
                files[relative] = extracted.read()
    return files


def _cache_dir() -> Path:
    root = os.environ.get("SUBRES_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "subres") / "npm"


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (FileNotFoundError, NotADirectoryError):
        return None


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


class BuildPyWithWebAssets(build_py):
    """`build_py` that also vendors the page's locked npm packages."""

    def run(self) -> None:
        target = ROOT / VENDOR if self.editable_mode else Path(self.build_lib) / VENDOR
        vendor_web_assets(target)
        super().run()


class SdistWithWebAssets(sdist):
    """An sdist that carries the page's files, so that building from it needs no network."""

    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, files)
        vendor_web_assets(Path(base_dir) / VENDOR)


if __name__ == "__main__":
    setup(cmdclass={"build_py": BuildPyWithWebAssets, "sdist": SdistWithWebAssets})
