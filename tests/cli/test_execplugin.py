"""`subres.cli.execplugin` on its own: a real plugin process and what it sees and prints.

The plugin is a small script that records its argv, environment and stdin,
then prints whatever ExecCredential the test asks for.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from subres.cli import execplugin
from subres.cli.execplugin import Credential, ExecPluginError

V1 = "client.authentication.k8s.io/v1"
V1BETA1 = "client.authentication.k8s.io/v1beta1"
SCRIPT = """\
#!{python}
import json, os, pathlib, sys
here = pathlib.Path(__file__).parent
stdin = sys.stdin.read() if os.environ.get("READ_STDIN") else None
seen = {{"argv": sys.argv[1:], "env": dict(os.environ), "stdin": stdin}}
(here / "seen.json").write_text(json.dumps(seen))
sys.stdout.write(os.environ.get("ANSWER", ""))
sys.exit(int(os.environ.get("EXIT", "0")))
"""

Run = Callable[..., Credential]


@pytest.fixture
def bin_dir(workdir: Path) -> Path:
    """A directory holding the plugin script `plugin`."""
    directory = workdir / "bin"
    directory.mkdir()
    script = directory / "plugin"
    script.write_text(SCRIPT.format(python=sys.executable))
    script.chmod(0o755)
    return directory


def answer(status: dict[str, Any], api_version: str = V1, kind: str = "ExecCredential") -> str:
    """What a plugin prints."""
    return json.dumps({"apiVersion": api_version, "kind": kind, "status": status})


def seen(bin_dir: Path) -> dict[str, Any]:
    """What the plugin recorded of its last run."""
    recorded: dict[str, Any] = json.loads((bin_dir / "seen.json").read_text())
    return recorded


@pytest.fixture
def run(workdir: Path, bin_dir: Path) -> Run:
    """Run the plugin through `execplugin.run` with `answer` as its output."""

    def call(
        printed: str,
        *,
        spec: dict[str, Any] | None = None,
        cluster: dict[str, Any] | None = None,
        environ: dict[str, str] | None = None,
    ) -> Credential:
        section = {
            "apiVersion": V1,
            "command": "./bin/plugin",
            "interactiveMode": "Never",
            "env": [{"name": "ANSWER", "value": printed}],
            **(spec or {}),
        }
        return execplugin.run(
            section, base=workdir, cluster=cluster, environ=environ or {"PATH": os.defpath}
        )

    return call


def test_token_and_what_the_plugin_is_given(run: Run, bin_dir: Path) -> None:
    spec = {
        "args": ["token", 7],
        "env": [
            {"name": "ANSWER", "value": answer({"token": "t0k"})},
            {"name": "FROM_SPEC", "value": "spec"},
            {"name": "READ_STDIN", "value": "1"},
        ],
    }
    credential = run("", spec=spec, environ={"PATH": os.defpath, "FROM_USER": "user"})
    assert credential == Credential(token="t0k")
    recorded = seen(bin_dir)
    assert recorded["argv"] == ["token", "7"]
    assert recorded["env"]["FROM_USER"] == "user"
    assert recorded["env"]["FROM_SPEC"] == "spec"
    # Not interactive: stdin is empty, not the user's terminal.
    assert recorded["stdin"] == ""
    info = json.loads(recorded["env"]["KUBERNETES_EXEC_INFO"])
    # Cluster information only when the kubeconfig asks for it.
    assert info == {"apiVersion": V1, "kind": "ExecCredential", "spec": {"interactive": False}}


def test_cluster_info_when_asked(run: Run, bin_dir: Path) -> None:
    cluster = {"server": "https://k.example:6443", "certificate-authority-data": "Q0E="}
    run(answer({"token": "t"}), spec={"provideClusterInfo": True}, cluster=cluster)
    info = json.loads(seen(bin_dir)["env"]["KUBERNETES_EXEC_INFO"])
    assert info["spec"] == {"interactive": False, "cluster": cluster}


def test_client_certificate(run: Run) -> None:
    status = {"clientCertificateData": "CERT", "clientKeyData": "KEY"}
    assert run(answer(status)) == Credential(client_certificate=b"CERT", client_key=b"KEY")


def test_v1beta1(run: Run) -> None:
    spec = {"apiVersion": V1BETA1}
    assert run(answer({"token": "b"}, V1BETA1), spec=spec) == Credential(token="b")


def test_bare_command_is_looked_up_in_path(run: Run, bin_dir: Path) -> None:
    environ = {"PATH": f"{bin_dir}{os.pathsep}{os.defpath}"}
    assert run(answer({"token": "p"}), spec={"command": "plugin"}, environ=environ).token == "p"


def test_absolute_command(run: Run, bin_dir: Path) -> None:
    assert run(answer({"token": "a"}), spec={"command": str(bin_dir / "plugin")}).token == "a"


@pytest.mark.parametrize(
    ("printed", "spec", "message"),
    [
        ("not json", {}, "did not print JSON"),
        (answer({"token": "t"}, kind="Other"), {}, "did not print an ExecCredential"),
        (answer({"token": "t"}, V1BETA1), {}, "answered .*v1beta1.*expected .*v1'"),
        (answer({}), {}, "neither a token nor a certificate"),
        (answer({"clientKeyData": "K"}), {}, "together"),
        (answer({"token": "t"}), {"apiVersion": "client.authentication.k8s.io/v1alpha1"}, "not"),
        (answer({"token": "t"}), {"command": ""}, "has no command"),
        (answer({"token": "t"}), {"interactiveMode": "Sometimes"}, "unknown interactiveMode"),
        (answer({"token": "t"}), {"env": [{"value": "x"}]}, "need a name"),
    ],
)
def test_refused_answers_and_specs(
    run: Run, printed: str, spec: dict[str, Any], message: str
) -> None:
    with pytest.raises(ExecPluginError, match=message):
        run(printed, spec=spec)


def test_failing_plugin(run: Run) -> None:
    spec = {"env": [{"name": "ANSWER", "value": ""}, {"name": "EXIT", "value": "4"}]}
    with pytest.raises(ExecPluginError, match="failed with exit code 4"):
        run("", spec=spec)


def test_missing_plugin_shows_the_install_hint(run: Run) -> None:
    spec = {"command": "subres-test-no-such-plugin", "installHint": "brew install it"}
    with pytest.raises(ExecPluginError, match=r"(?si)cannot run .*no such file.*brew install it"):
        run(answer({"token": "t"}), spec=spec)


class _Stdin:
    """What `sys.stdin` says about being a terminal."""

    def __init__(self, tty: bool) -> None:
        self._tty = tty

    def isatty(self) -> bool:
        return self._tty


@pytest.mark.parametrize(
    "case",
    [
        (False, "IfAvailable", False),
        (False, "Never", False),
        (True, "IfAvailable", True),
        (True, "Always", True),
        (True, "Never", False),
    ],
)
def test_interactive_modes(
    run: Run, bin_dir: Path, monkeypatch: pytest.MonkeyPatch, case: tuple[bool, str, bool]
) -> None:
    tty, mode, interactive = case
    monkeypatch.setattr(sys, "stdin", _Stdin(tty))
    run(answer({"token": "t"}), spec={"interactiveMode": mode})
    info = json.loads(seen(bin_dir)["env"]["KUBERNETES_EXEC_INFO"])
    assert info["spec"]["interactive"] is interactive


def test_always_interactive_without_a_terminal(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", _Stdin(False))
    with pytest.raises(ExecPluginError, match="needs an interactive terminal"):
        run(answer({"token": "t"}), spec={"interactiveMode": "Always"})
