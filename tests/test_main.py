"""The `subres` command line: what each verb imports, and client flags before server verbs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

TIMEOUT = 60.0
HEAVY = ("aiohttp", "websockets", "ssl", "kubernetes_asyncio", "subres.server", "subres.demo")

PROBE = """\
import sys
from subres.main import main
try:
    main({argv!r})
except SystemExit:
    pass
print(" ".join(sorted(m for m in {heavy!r} if m in sys.modules)))
"""


def _imported_by(argv: list[str], heavy: tuple[str, ...] = HEAVY) -> list[str]:
    """Which of `heavy` a fresh interpreter imported to run `subres ARGV`."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(argv=argv, heavy=heavy)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=True,
    )
    return done.stdout.splitlines()[-1].split()


@pytest.mark.parametrize("argv", [["--help"], ["console", "--help"], ["port-forward", "--help"]])
def test_help_imports_nothing_heavy(argv: list[str]) -> None:
    assert _imported_by(argv) == []


def test_a_client_verb_imports_only_what_it_uses() -> None:
    # Running console (here: failing on a missing kubeconfig) loads its own stack only.
    argv = ["--kubeconfig", "/nonexistent", "console", "demo"]
    assert _imported_by(argv) == ["ssl", "websockets"]


def _subres(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "subres", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


def test_kubeconfig_before_serve_is_honoured(tmp_path: Path) -> None:
    # The standalone check refuses a cluster kubeconfig: so serve did receive it.
    standalone = tmp_path / "machines.yaml"
    standalone.write_text("")
    done = _subres("--kubeconfig", tmp_path / "k", "serve", "--standalone", standalone)
    assert (done.returncode, done.stderr) == (
        2,
        "subres serve: --kubeconfig is for cluster mode, not --standalone\n",
    )


def test_serve_reads_the_kubeconfig_given_before_it(tmp_path: Path) -> None:
    missing = tmp_path / "absent-kubeconfig"
    args = ("serve", "--secure-port", "0", "--bind-address", "127.0.0.1")
    done = _subres("--kubeconfig", missing, *args, "--cert-dir", tmp_path / "certs")
    assert done.returncode == 1
    assert f"subres serve: 0 ConfigError: {missing}: " in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--kubeconfig", "a", "serve", "--kubeconfig", "b"],
            "subres serve: --kubeconfig is given twice: a before serve and b after it",
        ),
        (
            ["--context", "c", "serve"],
            "subres serve: --context is a flag of the client verbs; serve does not take it",
        ),
        (
            ["-n", "x", "demo"],
            "subres demo: --namespace is a flag of the client verbs; demo does not take it",
        ),
        (
            ["--kubeconfig", "k", "certs", "--out", "o"],
            "subres certs: --kubeconfig is a flag of the client verbs and serve; "
            "certs does not take it",
        ),
    ],
)
def test_client_flags_before_other_server_verbs_are_refused(argv: list[str], message: str) -> None:
    done = _subres(*argv)
    assert (done.returncode, done.stderr) == (2, message + "\n")
