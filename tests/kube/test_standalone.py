"""The standalone objects file: re-read when it changes, its problems said once per version."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from subres import config
from subres.kube.cache import ParentCache
from subres.kube.standalone import FileSource

MACHINE = """\
apiVersion: subres.dev/v1alpha1
kind: Machine
metadata: {name: vm1, namespace: default}
"""


def _source(path: Path) -> tuple[FileSource, ParentCache]:
    cache = ParentCache("machines")
    return FileSource(path, {"machines": cache}, config.load(None).parents), cache


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def _edit(path: Path, text: str) -> None:
    """Write `text` and move the mtime on, so even a same-size edit is seen."""
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(text)
    os.utime(path, ns=(before + 10**9, before + 10**9))


def test_a_broken_file_is_reported_once_per_version(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "machines.yaml"
    _edit(path, MACHINE)
    source, cache = _source(path)
    assert source.reload_if_changed()
    caplog.set_level(logging.WARNING, logger="subres.kube.standalone")
    _edit(path, MACHINE + "  broken: [\n")
    for _ in range(5):  # five polls of one broken version: one warning
        assert not source.reload_if_changed()
    assert len(_warnings(caplog)) == 1
    assert "not loaded, the objects read before stay" in _warnings(caplog)[0]
    assert cache.get("default", "vm1") is not None
    _edit(path, MACHINE + "  broken: {\n")  # another broken version: said again, once
    for _ in range(3):
        source.reload_if_changed()
    assert len(_warnings(caplog)) == 2
    _edit(path, MACHINE.replace("vm1", "vm2"))
    assert source.reload_if_changed()
    assert cache.get("default", "vm2") is not None
    path.unlink()
    for _ in range(3):
        assert not source.reload_if_changed()
    assert len(_warnings(caplog)) == 3
    assert "No such file or directory" in _warnings(caplog)[2]
