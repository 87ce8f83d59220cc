"""Small things a kubectl or virtctl user would trip over, each checked as they would meet it."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

import pexpect  # type: ignore[import-untyped]
import yaml

from tests.cli.conftest import CLI_TIMEOUT, Demo, cli, cli_env, run_cli


def test_a_screenshot_is_not_written_to_a_terminal(demo: Demo, workdir: Path) -> None:
    args = cli("--kubeconfig", demo.kubeconfig, "screenshot", "demo", "-o", "-")
    child = pexpect.spawn(args[0], args[1:], env=cli_env(workdir), timeout=CLI_TIMEOUT)
    try:
        child.expect_exact(b"error: -o - would write a PNG image to your terminal")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 1
    # Through a pipe it is what the user asked for.
    done = run_cli(["--kubeconfig", demo.kubeconfig, "screenshot", "demo", "-o", "-"], home=workdir)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(b"\x89PNG")


def test_web_on_a_busy_port_says_what_to_do(demo: Demo, workdir: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        done = run_cli(
            ["--kubeconfig", demo.kubeconfig, "web", "demo", "--port", str(port)], home=workdir
        )
    assert done.returncode == 1
    assert done.stderr.decode() == (
        f"error: cannot listen on 127.0.0.1:{port}: Address already in use; "
        "pass --port (0 picks a free one)\n"
    )


def test_usage_names_kubectl_subres_when_run_as_the_plugin(workdir: Path) -> None:
    plugin = Path(sys.executable).parent / "kubectl-subres"
    done = subprocess.run(
        [str(plugin), "console"],
        capture_output=True,
        env=cli_env(workdir),
        timeout=CLI_TIMEOUT,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.startswith(b"usage: kubectl subres console ")


def test_version_is_printed(workdir: Path) -> None:
    done = run_cli(["--version"], home=workdir)
    assert done.returncode == 0
    assert re.fullmatch(rb"subres \d+\.\d+\.\d+\S*\n", done.stdout), done.stdout


def test_sessions_print_as_yaml_too(demo: Demo, workdir: Path) -> None:
    done = run_cli(["--kubeconfig", demo.kubeconfig, "sessions", "-o", "yaml"], home=workdir)
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(done.stdout)["kind"] == "SessionList"


def test_replay_help_offers_no_cluster_flags(workdir: Path) -> None:
    """replay reads a file: --kubeconfig, --context and -n would do nothing there."""
    done = run_cli(["replay", "--help"], home=workdir)
    assert done.returncode == 0
    assert b"--speed" in done.stdout
    for flag in (b"--kubeconfig", b"--context", b"--namespace"):
        assert flag not in done.stdout


def test_tail_on_a_console_that_is_not_kept_says_so(demo: Demo, workdir: Path) -> None:
    args: list[str | Path] = ["--kubeconfig", demo.kubeconfig, "console", "demo", "--tail", "5"]
    done = run_cli(args, home=workdir, stdin=b"exit\n")
    assert done.returncode == 0, done.stderr
    assert done.stderr.decode().startswith(
        "Warning: the console of Machine default/demo is not kept, so it has no scrollback: "
        "tail is ignored"
    )


def test_the_remote_exit_status_is_the_exit_code(demo: Demo, workdir: Path) -> None:
    """As `kubectl exec`: a shell that exits 3 makes `subres console` exit 3."""
    args: list[str | Path] = ["--kubeconfig", demo.kubeconfig, "console", "demo"]
    done = run_cli(args, home=workdir, stdin=b"exit 3\n")
    assert done.returncode == 3, done.stderr
    assert b"exit code 3" in done.stderr
