"""The subres image as deploy/image/build.py makes it: what it says it holds, and reproducible.

One image for the replicas and the agents, from Debian's packages and the
Python distributions deploy/image/requirements.txt pins; non-root, no
bytecode written at run time, PYTHONMALLOC set; a manifest of its Debian
packages and Python distributions inside; two independent builds of the same
inputs with the same layer, byte for byte. The Containerfile, for podman and
docker users, says the same.
"""

from __future__ import annotations

import json
import re
import tarfile
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.cluster import images
from tests.cluster.conftest import SubresImages

pytestmark = pytest.mark.timeout(1800)  # a cold machine builds both images first

RECIPE = images.REPO / "deploy" / "image" / "subres.json"


def oci(archive: Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The archive's index, image manifest and configuration."""
    with tarfile.open(archive) as tar:

        def blob(digest: str) -> dict[str, Any]:
            member = tar.extractfile(f"blobs/sha256/{digest.removeprefix('sha256:')}")
            assert member is not None
            return dict(json.loads(member.read()))

        index_file = tar.extractfile("index.json")
        assert index_file is not None
        index = json.loads(index_file.read())
        manifest = blob(index["manifests"][0]["digest"])
        return index, manifest, blob(manifest["config"]["digest"])


def layer_file(archive: Path, name: str) -> bytes:
    _, manifest, _ = oci(archive)
    [layer] = manifest["layers"]
    with tarfile.open(archive) as tar:
        blob = tar.extractfile(f"blobs/sha256/{layer['digest'].removeprefix('sha256:')}")
        assert blob is not None
        with tarfile.open(fileobj=blob, mode="r:gz") as rootfs:
            member = rootfs.extractfile(f"./{name}")
            assert member is not None
            return member.read()


def test_two_builds_of_the_same_inputs_have_the_same_layer(built_images: SubresImages) -> None:
    a, b = built_images.installed, built_images.next
    assert a.layer == b.layer
    # Their tags and one label differ: two images, as an upgrade needs.
    assert a.digest != b.digest
    assert oci(a.path)[0]["manifests"][0]["annotations"]["io.containerd.image.name"] == a.name


def test_one_layer_a_non_root_user_and_the_allocator_that_returns_memory(
    built_images: SubresImages,
) -> None:
    _, manifest, config = oci(built_images.installed.path)
    assert len(manifest["layers"]) == 1
    assert config["config"]["User"] == "65532:65532"
    assert "PYTHONMALLOC=malloc" in config["config"]["Env"]
    assert "PYTHONDONTWRITEBYTECODE=1" in config["config"]["Env"]
    assert config["config"]["Entrypoint"] == ["subres"]


def test_the_image_lists_its_debian_packages_and_python_distributions(
    built_images: SubresImages,
) -> None:
    manifest = json.loads(layer_file(built_images.installed.path, "usr/share/subres/manifest.json"))
    debian = {p["package"]: p["version"] for p in manifest["debian"]}
    assert debian["python3"].startswith("3.11")
    assert "usrmerge" not in debian and "perl" not in debian
    python = {d["name"].lower().replace("_", "-"): d["version"] for d in manifest["python"]}
    pins = re.findall(r"^([\w.-]+)==(\S+)", (RECIPE.parent / "requirements.txt").read_text(), re.M)
    assert {name.lower().replace("_", "-"): v for name, v in pins}.items() <= python.items()
    assert python["subres"] == "0.1.0"
    assert "pip" not in python, "the installer is not installed"


def test_the_pins_satisfy_every_dependency_of_the_project() -> None:
    # A dependency pyproject.toml gains must be pinned too: `build.py lock` pins again.
    project = tomllib.loads((images.REPO / "pyproject.toml").read_text())["project"]
    pins = dict(
        re.findall(r"^([\w.-]+)==(\S+)", (RECIPE.parent / "requirements.txt").read_text(), re.M)
    )
    pinned = {canonicalize_name(name): Version(v) for name, v in pins.items()}
    for dependency in map(Requirement, project["dependencies"]):
        name = canonicalize_name(dependency.name)
        assert name in pinned, f"{dependency} is not pinned in deploy/image/requirements.txt"
        assert dependency.specifier.contains(pinned[name]), f"{name}=={pinned[name]}: {dependency}"


def test_the_containerfile_says_what_the_recipe_says() -> None:
    recipe = json.loads(RECIPE.read_text())["config"]
    text = (images.REPO / "Containerfile").read_text()
    assert f"USER {recipe['User']}" in text
    for variable in recipe["Env"]:
        assert f"ENV {variable}" in text
    assert f"ENTRYPOINT {json.dumps(recipe['Entrypoint'])}" in text
    assert f"CMD {json.dumps(recipe['Cmd'])}" in text
    assert "-r deploy/image/requirements.txt" in text and "--require-hashes" in text
