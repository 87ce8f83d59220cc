"""The lock the tests and the image install from agrees with what the package asks for.

`pip install --no-deps -e .` trusts the lock: a dependency added to
pyproject.toml and not locked would be missing from every fresh install.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
PIN = re.compile(r"^([A-Za-z0-9_.-]+)==(\S+)", re.MULTILINE)


def _pins(path: Path) -> dict[str, str]:
    return {canonicalize_name(n): v for n, v in PIN.findall(path.read_text())}


def _asked() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [
        Requirement(r)
        for r in [*project["dependencies"], *project["optional-dependencies"]["test"]]
    ]


def test_every_dependency_is_locked_at_a_version_the_package_allows() -> None:
    locked = _pins(ROOT / "requirements" / "test.txt")
    for requirement in _asked():
        version = locked.get(canonicalize_name(requirement.name))
        assert version is not None, (
            f"{requirement.name} is not in requirements/test.txt: scripts/lock"
        )
        assert requirement.specifier.contains(version, prereleases=True), (requirement, version)


def test_every_line_of_the_lock_carries_a_hash() -> None:
    text = (ROOT / "requirements" / "test.txt").read_text()
    entries = re.split(r"\n(?=[A-Za-z0-9_.-]+==)", text.split("\n", 2)[2])
    assert entries and all("--hash=sha256:" in entry for entry in entries if "==" in entry)


def test_the_image_pins_the_versions_the_tests_ran() -> None:
    tests = _pins(ROOT / "requirements" / "test.txt")
    image = _pins(ROOT / "deploy" / "image" / "requirements.txt")
    differ = {
        name: (version, tests.get(name))
        for name, version in image.items()
        if tests.get(name) != version
    }
    assert differ == {}, "the image and the tests pin different versions: scripts/lock"
