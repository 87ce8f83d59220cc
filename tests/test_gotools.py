"""The Go peers build from the module proxy and report what we pinned."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests import gotools

# A cold build runs well past the default per-test timeout.
pytestmark = pytest.mark.timeout(gotools.BUILD_TIMEOUT_S + 120)


def _run(args: list[str | Path], home: Path) -> subprocess.CompletedProcess[str]:
    # A scratch HOME and an empty KUBECONFIG keep the developer's cluster config out.
    env = {**os.environ, "HOME": str(home), "KUBECONFIG": str(home / "absent")}
    return subprocess.run(
        [str(a) for a in args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_kube_version_maps_staging_tags() -> None:
    gomod = Path(gotools.TOOLS / "kubectl" / "go.mod")
    assert gotools.kube_version(gomod) == "v1.37.2"


def test_kubectl_reports_pinned_version(tmp_path: Path) -> None:
    kubectl = gotools.kubectl()
    assert kubectl.is_relative_to(gotools.cache_dir())

    proc = _run([kubectl, "version", "--client", "-o", "json"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    client = json.loads(proc.stdout)["clientVersion"]
    assert client["gitVersion"] == "v1.37.2"
    assert (client["major"], client["minor"]) == ("1", "37")


def test_helm_reports_pinned_version(tmp_path: Path) -> None:
    assert gotools.helm_version(gotools.TOOLS / "helm" / "go.mod") == "v4.3.2"
    helm = gotools.helm()
    assert helm.is_relative_to(gotools.cache_dir())
    proc = _run([helm, "version", "--template", "{{.Version}} {{.GitTreeState}}"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "v4.3.2 clean"


def test_cached_binary_is_reused() -> None:
    first = gotools.kubectl()
    mtime = first.stat().st_mtime_ns
    started = time.monotonic()
    again = gotools.kubectl()
    assert again == first
    assert again.stat().st_mtime_ns == mtime
    assert time.monotonic() - started < 5


def test_missing_tool_is_a_clear_error() -> None:
    with pytest.raises(gotools.GoBuildError, match="no Go module"):
        gotools.build("no-such-tool")


def test_kubepeer_builds_and_explains_itself(tmp_path: Path) -> None:
    kubepeer = gotools.kubepeer()

    top = _run([kubepeer, "--help"], tmp_path)
    assert top.returncode == 0, top.stderr
    assert "portforward" in top.stdout
    assert "exec" in top.stdout

    for command in ("portforward", "exec"):
        # Go's flag package prints a command's flags on stderr.
        sub = _run([kubepeer, command, "--help"], tmp_path)
        assert sub.returncode == 0, sub.stderr
        assert "-transport" in sub.stderr


def test_kubepeer_rejects_a_bad_command_line(tmp_path: Path) -> None:
    kubepeer = gotools.kubepeer()
    proc = _run([kubepeer, "exec", "--url", "/x"], tmp_path)
    assert proc.returncode == 2
    assert "--kubeconfig and --url are required" in proc.stderr


def test_failed_build_shows_go_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    broken = tmp_path / "tools" / "broken"
    broken.mkdir(parents=True)
    (broken / "go.mod").write_text("module example.com/broken\n\ngo 1.26.0\n")
    (broken / "main.go").write_text("package main\n\nfunc main() { notDefined() }\n")
    monkeypatch.setattr(gotools, "TOOLS", tmp_path / "tools")
    monkeypatch.setenv("SUBRES_CACHE", str(tmp_path / "cache"))

    with pytest.raises(gotools.GoBuildError, match="undefined: notDefined"):
        gotools.build("broken")
    assert not any((tmp_path / "cache" / "bin").glob("*broken*"))
