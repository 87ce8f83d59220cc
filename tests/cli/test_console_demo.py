"""`subres console` end to end against the real `subres demo` server."""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pexpect  # type: ignore[import-untyped]
import pytest
import yaml

from tests.cli.conftest import (
    CLI_TIMEOUT,
    Demo,
    cli,
    cli_env,
    read_until,
    run_cli,
    running_demo,
    stop,
)

EXPECT_TIMEOUT = 20
STTY_STATE = rb"([0-9a-f]+(?::[0-9a-f]+){10,})\r\n"


def _spawn(command: str, args: list[str], home: Path) -> pexpect.spawn:
    return pexpect.spawn(
        command, args, env=cli_env(home), timeout=EXPECT_TIMEOUT, dimensions=(24, 80)
    )


def test_interactive_session_restores_the_terminal(demo: Demo, workdir: Path) -> None:
    console = shlex.join(cli("--kubeconfig", demo.kubeconfig, "console", "demo"))
    child = _spawn("/bin/sh", ["-c", f'stty -g; {console}; echo "rc=$?"; stty -g'], workdir)
    try:
        child.expect(STTY_STATE)
        before = child.match.group(1)
        child.expect_exact(b"Connected to machine/demo. Escape with Ctrl+]")
        child.expect_exact(b"demo$ ")
        child.sendline("echo $((6*7))")
        child.expect_exact(b"\r\n42\r\n")
        child.send(b"\x1d")
        child.expect(rb"rc=(\d+)\r\n")
        assert child.match.group(1) == b"0"
        child.expect(STTY_STATE)
        assert child.match.group(1) == before
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)


def test_resizing_the_terminal_resizes_the_demo_shell(demo: Demo, workdir: Path) -> None:
    child = _spawn(
        str(cli()[0]), cli("--kubeconfig", demo.kubeconfig, "console", "demo")[1:], workdir
    )
    try:
        child.expect_exact(b"demo$ ")
        child.sendline("stty size")
        child.expect_exact(b"\r\n24 80\r\n")
        child.setwinsize(40, 120)  # the CLI hears SIGWINCH and sends the new size
        # The signal and the typed line travel separately: ask again if the line won.
        for _ in range(5):
            child.sendline("stty size")
            if child.expect_exact([b"\r\n40 120\r\n", b"\r\n24 80\r\n"]) == 0:
                break
        else:
            raise AssertionError("the demo shell never saw the new size")
        child.send(b"\x1d")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)


# The page's box grammar: NAME, TYPE/NAME, NAMESPACE/NAME.
@pytest.mark.parametrize("target", ["demo", "machine/demo", "default/demo"])
def test_piped_script_runs_and_exits_zero(demo: Demo, workdir: Path, target: str) -> None:
    done = run_cli(
        ["--kubeconfig", demo.kubeconfig, "console", target],
        home=workdir,
        stdin=b"echo hi-$((1+2))\nexit\n",
    )
    assert done.returncode == 0, done.stderr
    assert b"hi-3" in done.stdout
    assert b"Escape with" not in done.stderr


def test_piped_payload_arrives_intact(demo: Demo, workdir: Path) -> None:
    payload = base64.encodebytes(os.urandom(200_000))
    script = b"sha256sum <<'EOF'\n" + payload + b"EOF\nexit\n"
    done = run_cli(["--kubeconfig", demo.kubeconfig, "console", "demo"], home=workdir, stdin=script)
    assert done.returncode == 0, done.stderr
    assert hashlib.sha256(payload).hexdigest().encode() in done.stdout


def test_flags_after_the_verb_and_kubeconfig_from_the_environment(
    demo: Demo, workdir: Path
) -> None:
    env_home = workdir
    done = subprocess.run(
        cli("console", "demo", "-n", "default", "--kubeconfig", demo.kubeconfig),
        input=b"echo after-$((2*2))\nexit\n",
        capture_output=True,
        env=cli_env(env_home),
        timeout=CLI_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert b"after-4" in done.stdout


def test_namespace_flag_reaches_the_url(demo: Demo, workdir: Path) -> None:
    done = run_cli(
        ["--kubeconfig", demo.kubeconfig, "-n", "elsewhere", "console", "machine/demo"],
        home=workdir,
    )
    assert done.returncode == 1
    assert done.stderr == (
        b'Error from server (NotFound): machines.subres.dev "demo" not found'
        b' in namespace "elsewhere"\n'
    )


@pytest.mark.parametrize(
    ("name", "expected"),
    [("stopped", b"Stopped"), ("nosuch", b"not found")],
)
def test_refused_console_prints_the_status_message(
    demo: Demo, workdir: Path, name: str, expected: bytes
) -> None:
    done = run_cli(["--kubeconfig", demo.kubeconfig, "console", name], home=workdir)
    assert done.returncode == 1
    assert done.stderr.startswith(b"Error from server (")
    assert expected in done.stderr


def test_wrong_token_is_unauthorized(demo: Demo, workdir: Path) -> None:
    config = yaml.safe_load(demo.kubeconfig.read_text())
    config["users"][0]["user"]["token"] = "not-the-token"
    kubeconfig = workdir / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))
    done = run_cli(["--kubeconfig", kubeconfig, "console", "demo"], home=workdir)
    assert done.returncode == 1
    assert done.stderr == b"error: You must be logged in to the server (Unauthorized)\n"


def test_missing_kubeconfig_is_a_clear_error(workdir: Path) -> None:
    done = run_cli(["console", "demo", "--kubeconfig", workdir / "absent"], home=workdir)
    assert done.returncode == 1
    assert done.stderr == f"error: kubeconfig {workdir / 'absent'} does not exist\n".encode()


def test_second_session_takes_over_the_first(demo: Demo, workdir: Path) -> None:
    child = _spawn(cli()[0], cli("--kubeconfig", demo.kubeconfig, "console", "demo")[1:], workdir)
    try:
        child.expect_exact(b"demo$ ")
        second = run_cli(
            ["--kubeconfig", demo.kubeconfig, "console", "demo"], home=workdir, stdin=b"exit\n"
        )
        assert second.returncode == 0, second.stderr
        child.expect_exact(b"console of default/demo taken over by demo")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 1


def test_works_as_a_kubectl_plugin(demo: Demo, workdir: Path, kubectl_bin: Path) -> None:
    # kubectl finds plugins on PATH: the installed entry point sits beside our Python.
    plugin = Path(sys.executable).parent / "kubectl-subres"
    assert plugin.is_file(), "pip install . puts kubectl-subres next to python"
    env = cli_env(workdir)
    env["PATH"] = f"{plugin.parent}{os.pathsep}{env.get('PATH', '')}"
    done = subprocess.run(
        [str(kubectl_bin), "subres", "console", "demo"],
        input=b"echo plugin-$((3*3))\nexit\n",
        capture_output=True,
        env={**env, "KUBECONFIG": str(demo.kubeconfig)},
        timeout=CLI_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert b"plugin-9" in done.stdout


@pytest.fixture
def own_demo() -> Iterator[Demo]:
    """A demo whose machines file the test may change."""
    with running_demo() as running:
        yield running


def _set_phase(demo: Demo, name: str, phase: str) -> None:
    path = demo.state_dir / "machines.yaml"
    machines = list(yaml.safe_load_all(path.read_text()))
    for machine in machines:
        if machine["metadata"]["name"] == name:
            machine["status"]["phase"] = phase
    # Replace, never rewrite in place: the server must not read half a file.
    scratch = path.with_suffix(".new")
    scratch.write_text(yaml.safe_dump_all(machines))
    scratch.replace(path)


def test_timeout_waits_for_the_machine_to_start(own_demo: Demo, workdir: Path) -> None:
    proc = subprocess.Popen(
        cli("--kubeconfig", own_demo.kubeconfig, "console", "stopped", "--timeout", "1m"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=cli_env(workdir),
    )
    try:
        assert proc.stdin is not None
        proc.stdin.write(b"echo started-$((4+5))\nexit\n")
        proc.stdin.close()
        read_until(proc, rb"machine/stopped: .*Stopped.*; waiting", timeout=20, stream="stderr")
        _set_phase(own_demo, "stopped", "Running")
        read_until(proc, rb"started-9", timeout=20)
        assert proc.wait(CLI_TIMEOUT) == 0
    finally:
        stop(proc)
        for pipe in (proc.stdout, proc.stderr):
            assert pipe is not None
            pipe.close()


def test_timeout_gives_up_with_the_last_message(demo: Demo, workdir: Path) -> None:
    done = run_cli(
        ["--kubeconfig", demo.kubeconfig, "console", "stopped", "--timeout", "1s"], home=workdir
    )
    assert done.returncode == 1
    lines = done.stderr.decode().splitlines()
    assert re.fullmatch(r"machine/stopped: .*Stopped.*; waiting", lines[0])
    assert lines[-1].startswith("Error from server (Conflict): ") and "Stopped" in lines[-1]


def test_a_stopped_machine_suggests_waiting_for_it(demo: Demo, workdir: Path) -> None:
    done = run_cli(["--kubeconfig", demo.kubeconfig, "console", "stopped"], home=workdir)
    assert done.returncode == 1
    lines = done.stderr.decode().splitlines()
    assert lines[0].startswith("Error from server (Conflict): Machine default/stopped is not")
    assert lines[1:] == ["hint: --timeout 5m waits for it to become available"]
