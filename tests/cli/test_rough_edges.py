"""Small things a kubectl or virtctl user would trip over, each checked as they would meet it."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pexpect  # type: ignore[import-untyped]

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
