#!/usr/bin/env python3
"""Build a container image from Debian's packages and PyPI, with no registry and no engine.

The image is one layer, written as an OCI image layout in a tar file, which
``ctr -n k8s.io images import``, ``podman load`` or ``skopeo copy oci-archive:``
take as it is. What goes in is a recipe (``subres.json`` beside this file is the
subres image; ``Containerfile`` says the same for podman and docker users):

- ``debian``: a root filesystem made by ``mmdebstrap`` (Debian's package, run as
  root) from a suite's packages, documentation and translations left out
  except the copyright files;
- ``python``: a virtualenv at ``venv`` made by Debian's python3, holding this
  project's wheel (built from the source tree) and the distributions pinned
  with their hashes in ``requirements``, installed from local files only;
- ``files``: files copied in (``--copy SRC=DEST`` adds more);
- ``config``: the OCI image configuration (user, environment, entrypoint).

Every image carries ``/usr/share/subres/manifest.json``: its Debian packages
and Python distributions with their versions, and what it was built from.

Two builds from the same inputs (this source tree, the recipe, the same state
of the Debian mirror, ``--epoch``) give the same bytes, so the same digest;
mmdebstrap makes the root filesystem reproducible under ``SOURCE_DATE_EPOCH``.
The mirror is an input: point ``--mirror`` at a snapshot.debian.org URL to pin it.

    python3 deploy/image/build.py --out subres.oci.tar        # prints the image digest
    ctr -n k8s.io images import subres.oci.tar                  # localhost/subres:<version>
    python3 deploy/image/build.py lock                          # re-pin requirements.txt
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = ["Recipe", "build", "main", "write_manifest"]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
MANIFEST = "usr/share/subres/manifest.json"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# Wheels for Debian 12's CPython 3.11 on amd64 (glibc 2.36): pip needs every
# manylinux tag the interpreter accepts spelled out.
PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(36, 16, -1)] + [
    "manylinux2014_x86_64"
]
TARGET = ["--python-version", "3.11", "--implementation", "cp"]
ABIS = ["--abi", "cp311", "--abi", "abi3", "--abi", "none"]
# Left out of the root filesystem: manuals, translations and documentation,
# except the copyright files, which the licences require.
DPKG_FILTERS = [
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/locale/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
]


class BuildError(RuntimeError):
    """A step of the build failed; the message says which and why."""


@dataclass(frozen=True)
class Recipe:
    """What goes into an image (a recipe JSON file, paths relative to it)."""

    name: str
    """Image name without tag, e.g. ``localhost/subres``."""
    config: Mapping[str, Any]
    """The OCI image configuration's ``config`` object (User, Env, Entrypoint, Cmd...)."""
    suite: str | None = None
    """Debian suite for mmdebstrap; None builds the image from ``files`` alone."""
    packages: tuple[str, ...] = ()
    """Debian packages beyond the essential set."""
    venv: str | None = None
    """Where the Python virtualenv goes; None installs no Python distributions."""
    requirements: Path | None = None
    """Pinned distributions with hashes (``name==version --hash=sha256:...``)."""
    installer: Path | None = None
    """The pinned pip that installs them (not itself installed)."""
    files: tuple[tuple[Path, str], ...] = ()
    """(source on this machine, absolute destination in the image)."""
    labels: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> Recipe:
        data = json.loads(path.read_text())
        debian = data.get("debian") or {}
        python = data.get("python") or {}

        def here(value: str | None) -> Path | None:
            return None if value is None else (path.parent / value).resolve()

        return cls(
            name=data["name"],
            config=data["config"],
            suite=debian.get("suite"),
            packages=tuple(debian.get("packages", ())),
            venv=python.get("venv"),
            requirements=here(python.get("requirements")),
            installer=here(python.get("installer")),
            files=tuple(
                (here(src) or Path(src), dest) for src, dest in data.get("files", {}).items()
            ),
            labels=data.get("labels", {}),
        )


@dataclass(frozen=True)
class Image:
    """A built OCI archive."""

    path: Path
    name: str
    digest: str
    """The manifest's digest, ``sha256:...``: what ``ctr images ls`` shows."""
    layer: str
    """The digest of the root filesystem tar (its diff_id), ``sha256:...``."""


def build(
    recipe: Recipe,
    *,
    tag: str,
    out: Path,
    epoch: int,
    mirror: str = DEFAULT_MIRROR,
    extra_files: Sequence[tuple[Path, str]] = (),
    labels: Mapping[str, str] | None = None,
    cache: Path | None = None,
) -> Image:
    """Build `recipe` as ``NAME:TAG`` into the OCI archive `out`.

    The tag and `labels` (added to the recipe's) go into the image's configuration
    only: two builds that differ in them alone have the same layer.
    """
    cache = cache or _cache_dir()
    with tempfile.TemporaryDirectory(prefix="subres-image-") as scratch_dir:
        scratch = Path(scratch_dir)
        rootfs = scratch / "rootfs.tar"
        files = [*recipe.files, *extra_files]
        inputs = {"epoch": epoch, "mirror": mirror if recipe.suite else None}
        if recipe.suite is None:
            _files_only_tar(rootfs, files, epoch=epoch, inputs=inputs)
        else:
            wheels = _wheelhouse(recipe, scratch / "wheels", cache) if recipe.venv else None
            _mmdebstrap(
                recipe, rootfs, files, wheels=wheels, epoch=epoch, mirror=mirror, inputs=inputs
            )
        name = f"{recipe.name}:{tag}"
        labels = {**recipe.labels, **(labels or {})}
        digest, layer = _oci_archive(
            rootfs, out, name=name, config=recipe.config, labels=labels, epoch=epoch
        )
    return Image(path=out, name=name, digest=digest, layer=layer)


# -- Python distributions -----------------------------------------------------


def _wheelhouse(recipe: Recipe, into: Path, cache: Path) -> Path:
    """This project's wheel, the pinned distributions and the installer, as local files."""
    assert recipe.requirements is not None and recipe.installer is not None
    into.mkdir()
    _project_wheel(into)
    downloads = cache / "wheels"
    for requirements in (recipe.requirements, recipe.installer):
        _run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--only-binary=:all:",
                "--require-hashes",
                "-r",
                str(requirements),
                "-d",
                str(downloads),
                *(arg for platform in PLATFORMS for arg in ("--platform", platform)),
                *TARGET,
                *ABIS,
            ]
        )
        for line in _pins(requirements):
            shutil.copy2(_downloaded(downloads, line), into)
    return into


def _project_wheel(into: Path) -> None:
    """This project's wheel, built from a copy of its source files alone: a build directory
    left in the checkout would otherwise lend the wheel files the sources no longer have."""
    with tempfile.TemporaryDirectory(prefix="subres-source-") as copy:
        for name in _source_files():
            target = Path(copy, name)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, target)
        _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(into), copy])


def _source_files() -> list[str]:
    """The checkout's files, committed or not, that git does not ignore."""
    proc = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=False,
    )
    if proc.returncode != 0:
        raise BuildError(f"cannot list the sources with git: {proc.stderr.decode().strip()}")
    names = [n for n in proc.stdout.decode().split("\0") if n]
    return [n for n in names if (ROOT / n).is_file()]


def _pins(requirements: Path) -> list[str]:
    """The ``name==version`` of each line of a requirements file."""
    pins = []
    for line in requirements.read_text().splitlines():
        pin = line.split("#", 1)[0].split("--hash", 1)[0].strip().rstrip("\\").strip()
        if pin:
            pins.append(pin)
    return pins


def _downloaded(directory: Path, pin: str) -> Path:
    name, _, version = pin.partition("==")
    wanted = re.sub(r"[-_.]+", "_", name).lower()
    for path in directory.glob("*.whl"):
        dist, wheel_version = path.name.split("-")[:2]
        if re.sub(r"[-_.]+", "_", dist).lower() == wanted and wheel_version == version:
            return path
    raise BuildError(f"pip downloaded no wheel for {pin} into {directory}")


# -- the root filesystem ------------------------------------------------------


def _mmdebstrap(
    recipe: Recipe,
    out: Path,
    files: Sequence[tuple[Path, str]],
    *,
    wheels: Path | None,
    epoch: int,
    mirror: str,
    inputs: Mapping[str, Any],
) -> None:
    if shutil.which("mmdebstrap") is None:
        raise BuildError("needs mmdebstrap (Debian's package): apt-get install mmdebstrap")
    if os.geteuid() != 0:
        raise BuildError("mmdebstrap makes the root filesystem as root here: run as root")
    hooks: list[str] = []
    for source, dest in files:
        hooks += [
            f'mkdir -p "$1"{shlex.quote(str(Path(dest).parent))}',
            f"copy-in {shlex.quote(str(source))} {shlex.quote(str(Path(dest).parent))}",
        ]
        if source.name != Path(dest).name:
            hooks.append(
                f'mv "$1"{shlex.quote(str(Path(dest).parent / source.name))} '
                f'"$1"{shlex.quote(dest)}'
            )
    if wheels is not None:
        hooks += _python_hooks(recipe, wheels)
    manifest = json.dumps({"inputs": inputs, "venv": recipe.venv})
    hooks.append(
        f"{shlex.quote(sys.executable)} {shlex.quote(str(Path(__file__).resolve()))} "
        f'manifest "$1" {shlex.quote(manifest)}'
    )
    args = [
        "mmdebstrap",
        "--variant=essential",
        "--quiet",
        # A merged /usr without the usrmerge package (and the Perl it pulls in).
        "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
        *(f"--dpkgopt={option}" for option in DPKG_FILTERS),
        *(f"--customize-hook={hook}" for hook in hooks),
    ]
    if recipe.packages:
        args.append("--include=" + ",".join(recipe.packages))
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(epoch)}
    _run([*args, recipe.suite or "", str(out), mirror], env=env)


def _python_hooks(recipe: Recipe, wheels: Path) -> list[str]:
    """mmdebstrap hooks: a venv by the image's python3, pip run from its wheel, no index."""
    assert recipe.venv is not None and recipe.installer is not None
    installer = _pins(recipe.installer)[0]
    pip = next(wheels.glob(f"pip-{installer.partition('==')[2]}-*.whl")).name
    project = next(wheels.glob("subres-*.whl")).name.split("-")[1]
    venv = shlex.quote(recipe.venv)
    # By name from the local files, not by path: pip records no direct_url.json then.
    install = (
        f"{venv}/bin/python /tmp/wheels/{pip}/pip install --quiet --no-index --no-cache-dir "
        f"--find-links /tmp/wheels --root-user-action=ignore --disable-pip-version-check "
        f"--no-warn-script-location subres=={project}"
    )
    return [
        'mkdir "$1"/tmp/wheels',
        f"copy-in {shlex.quote(str(wheels))}/. /tmp/wheels",
        f'chroot "$1" python3 -m venv --without-pip {venv}',
        f'chroot "$1" sh -c {shlex.quote(install)}',
        'rm -rf "$1"/tmp/wheels',
    ]


def write_manifest(rootfs: Path, extra: Mapping[str, Any]) -> dict[str, Any]:
    """Write the image's manifest of Debian packages and Python distributions into `rootfs`."""
    manifest: dict[str, Any] = {"built_from": extra.get("inputs", {})}
    status = rootfs / "var/lib/dpkg/status"
    if status.is_file():
        manifest["debian"] = _dpkg_packages(status.read_text())
    venv = extra.get("venv")
    if venv:
        manifest["python"] = _distributions(rootfs / venv.lstrip("/"))
    target = rootfs / MANIFEST
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


def _dpkg_packages(status: str) -> list[dict[str, str]]:
    packages = []
    for stanza in status.split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in stanza.splitlines() if ": " in line and line[0] != " "
        )
        if fields.get("Status", "").endswith(" installed"):
            packages.append({k.lower(): fields[k] for k in ("Package", "Version", "Architecture")})
    return sorted(packages, key=lambda p: p["package"])


def _distributions(venv: Path) -> list[dict[str, str]]:
    found = []
    for metadata in venv.glob("lib/python3*/site-packages/*.dist-info/METADATA"):
        head = metadata.read_text(errors="replace").split("\n\n", 1)[0]
        fields = dict(line.split(": ", 1) for line in head.splitlines() if ": " in line)
        found.append({"name": fields["Name"], "version": fields["Version"]})
    return sorted(found, key=lambda d: d["name"].lower())


def _files_only_tar(
    out: Path, files: Iterable[tuple[Path, str]], *, epoch: int, inputs: Mapping[str, Any]
) -> None:
    """A root filesystem of the given files alone (and the manifest), with fixed metadata."""
    with tempfile.TemporaryDirectory() as scratch:
        write_manifest(Path(scratch), {"inputs": inputs})
        entries = [(Path(scratch) / MANIFEST, "/" + MANIFEST), *files]
        with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
            for directory in sorted({p for _, d in entries for p in Path(d).parents} - {Path("/")}):
                tar.addfile(_info(str(directory).lstrip("/"), tarfile.DIRTYPE, 0o755, epoch))
            for source, dest in sorted(entries, key=lambda e: e[1]):
                data = source.read_bytes()
                mode = 0o755 if os.access(source, os.X_OK) else 0o644
                info = _info(dest.lstrip("/"), tarfile.REGTYPE, mode, epoch)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def _info(name: str, kind: bytes, mode: int, epoch: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = kind, mode, epoch
    return info


# -- the OCI archive ------------------------------------------------------------


def _oci_archive(
    rootfs: Path,
    out: Path,
    *,
    name: str,
    config: Mapping[str, Any],
    labels: Mapping[str, str],
    epoch: int,
) -> tuple[str, str]:
    """Wrap the root filesystem tar as a one-layer OCI image layout in the tar file `out`.

    Returns the manifest's digest and the layer's diff_id.
    """
    diff_id = _sha256_file(rootfs)
    layer = _gzip(rootfs)
    created = datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    image_config = _blob(
        {
            "architecture": "amd64",
            "os": "linux",
            "created": created,
            "config": {**config, "Labels": dict(labels)},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            "history": [{"created": created, "created_by": "deploy/image/build.py"}],
        }
    )
    manifest = _blob(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": _descriptor("application/vnd.oci.image.config.v1+json", image_config),
            "layers": [_descriptor("application/vnd.oci.image.layer.v1.tar+gzip", layer)],
        }
    )
    manifest_descriptor = {
        **_descriptor("application/vnd.oci.image.manifest.v1+json", manifest),
        "platform": {"architecture": "amd64", "os": "linux"},
        # containerd's importers name the image by the first, the OCI spec by the second.
        "annotations": {
            "io.containerd.image.name": name,
            "org.opencontainers.image.ref.name": name,
        },
    }
    index = _blob(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [manifest_descriptor],
        }
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.partial")
    with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}', epoch)
        _add(tar, "index.json", index, epoch)
        for blob in sorted([image_config, manifest, layer], key=_sha256):
            _add(tar, f"blobs/sha256/{_sha256(blob)}", blob, epoch)
    partial.replace(out)
    return f"sha256:{_sha256(manifest)}", diff_id


def _blob(obj: Mapping[str, Any]) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _descriptor(media_type: str, blob: bytes) -> dict[str, Any]:
    return {"mediaType": media_type, "digest": f"sha256:{_sha256(blob)}", "size": len(blob)}


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"


def _gzip(path: Path) -> bytes:
    """The file gzipped with no name and no time in the header, so equal input gives equal bytes."""
    buffer = io.BytesIO()
    with (
        path.open("rb") as source,
        gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0, compresslevel=6) as zipped,
    ):
        shutil.copyfileobj(source, zipped, 1 << 20)
    return buffer.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes, epoch: int) -> None:
    info = _info(name, tarfile.REGTYPE, 0o644, epoch)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


# -- pinning ----------------------------------------------------------------------


def lock(requirements: Path, installer: Path) -> None:
    """Pin this project's dependencies, as the image's Python resolves them, with hashes."""
    with tempfile.TemporaryDirectory() as scratch:
        _project_wheel(Path(scratch))
        project = next(Path(scratch).glob("subres-*.whl"))
        downloads = Path(scratch) / "downloads"
        platform = [arg for p in PLATFORMS for arg in ("--platform", p)]
        common = ["download", "-q", "--only-binary=:all:", *platform, *TARGET, *ABIS]
        _run([sys.executable, "-m", "pip", *common, "-d", str(downloads), str(project)])
        _run([sys.executable, "-m", "pip", *common, "--no-deps", "-d", str(downloads), "pip"])
        wheels = sorted(p for p in downloads.glob("*.whl") if not p.name.startswith("subres-"))
        pins = {p: _pin_line(p) for p in wheels}
    header = (
        "# The image's Python distributions: `python3 deploy/image/build.py lock` writes this.\n"
    )
    requirements.write_text(
        header + "".join(v for p, v in pins.items() if not p.name.startswith("pip-"))
    )
    installer.write_text(
        "# The pip that installs them into the image (not itself installed).\n"
        + "".join(v for p, v in pins.items() if p.name.startswith("pip-"))
    )


def _pin_line(wheel: Path) -> str:
    name, version = wheel.name.split("-")[:2]
    digest = _sha256_file(wheel).removeprefix("sha256:")
    return f"{name}=={version} --hash=sha256:{digest}\n"


# -- running things -----------------------------------------------------------------


def _run(args: Sequence[str], *, env: Mapping[str, str] | None = None) -> None:
    """Run a step; on failure raise BuildError with its output."""
    proc = subprocess.run(
        args, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise BuildError(
            f"{shlex.join(args)} exited {proc.returncode}:\n"
            f"{proc.stdout[-4000:]}{proc.stderr[-4000:]}"
        )


def _cache_dir() -> Path:
    root = os.environ.get("SUBRES_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "subres"


def _project_version() -> str:
    found = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    if found is None:
        raise BuildError("no version in pyproject.toml")
    return found[1]


def _source_epoch() -> int:
    """SOURCE_DATE_EPOCH if set, else the time of the source tree's last commit."""
    if "SOURCE_DATE_EPOCH" in os.environ:
        return int(os.environ["SOURCE_DATE_EPOCH"])
    proc = subprocess.run(
        ["git", "-C", str(ROOT), "log", "-1", "--format=%ct"],
        capture_output=True,
        text=True,
        check=False,
    )
    return int(proc.stdout.strip()) if proc.returncode == 0 and proc.stdout.strip() else 0


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="build.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", type=Path, default=HERE / "subres.json")
    parser.add_argument("--out", type=Path, help="the OCI archive (default NAME-TAG.oci.tar)")
    parser.add_argument("--tag", help="the image's tag (default the project's version)")
    parser.add_argument("--mirror", default=DEFAULT_MIRROR, help="Debian mirror (an input)")
    parser.add_argument("--epoch", type=int, help="timestamps (default: the last commit's)")
    parser.add_argument(
        "--copy", action="append", default=[], metavar="SRC=DEST", help="add a file"
    )
    parser.add_argument(
        "--label", action="append", default=[], metavar="KEY=VALUE", help="add a label"
    )
    parser.add_argument("command", nargs="*", help="`lock`, or `manifest ROOTFS JSON` (a hook)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] = sys.argv[1:]) -> int:
    args = _parse(argv)
    try:
        if args.command[:1] == ["manifest"]:
            write_manifest(Path(args.command[1]), json.loads(args.command[2]))
            return 0
        recipe = Recipe.load(args.recipe)
        if args.command == ["lock"]:
            assert recipe.requirements is not None and recipe.installer is not None
            lock(recipe.requirements, recipe.installer)
            return 0
        tag = args.tag or _project_version()
        copies = [(Path(s).resolve(), d) for s, _, d in (c.partition("=") for c in args.copy)]
        out = args.out or Path(f"{recipe.name.rsplit('/', 1)[-1]}-{tag}.oci.tar")
        epoch = args.epoch if args.epoch is not None else _source_epoch()
        labels = dict(label.partition("=")[::2] for label in args.label)
        image = build(
            recipe,
            tag=tag,
            out=out,
            epoch=epoch,
            mirror=args.mirror,
            extra_files=copies,
            labels=labels,
        )
    except BuildError as exc:
        print(f"build.py: {exc}", file=sys.stderr)
        return 1
    print(
        json.dumps(
            {
                "path": str(image.path),
                "name": image.name,
                "digest": image.digest,
                "layer": image.layer,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
