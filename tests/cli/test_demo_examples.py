"""Every command `subres demo` prints under "Try:" works, under bash and sh, piped and in a PTY.

The machine's shell is bash in one demo and sh in the other; each printed
line is run as printed, after the printed `export KUBECONFIG=…` line, by
`bash -c` and `sh -c` (the user's shell). Only a listening port is changed
where a fixed one could be taken on a shared machine (8080, 8070), and vnc
gets a viewer that exits at once.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pexpect  # type: ignore[import-untyped]
import pytest

from tests.cli.conftest import CLI_TIMEOUT, Demo, cli_env, read_until, running, running_demo

SHELLS = ("/bin/bash", "/bin/sh")
EXPECT_TIMEOUT = 20


@pytest.fixture(scope="module", params=SHELLS, ids=["bash-machine", "sh-machine"])
def shell_demo(request: pytest.FixtureRequest) -> Iterator[Demo]:
    """A demo whose machine's console runs `request.param`."""
    with running_demo(shell=request.param) as running:
        yield running


def _env(home: Path) -> dict[str, str]:
    """The user's environment: `subres` (our entry point) on PATH, no kubeconfig of theirs."""
    env = cli_env(home)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def tried(demo: Demo, verb: str, *, then: str = "") -> str:
    """The "Try:" line that runs `verb`, as the user types it after the export line
    (`exec` for a process the test stops), and `then` after it.

    The line's remark (a shell comment) is left out, so that flags can follow.
    """
    for line in demo.banner.split("Try:", 1)[1].splitlines():
        if f" {verb} " in f"{line} ":
            command = re.sub(r"\s+# .*$", "", line.strip())
            return f"{exported(demo)}; {then}{command}"
    raise AssertionError(f"no {verb} line in {demo.banner}")


def exported(demo: Demo) -> str:
    """The banner's `export KUBECONFIG=…` line."""
    match = re.search(r"^  (export KUBECONFIG=\S+)$", demo.banner, re.MULTILINE)
    assert match, demo.banner
    return match.group(1)


@pytest.mark.parametrize("user_shell", SHELLS)
def test_the_piped_example(shell_demo: Demo, workdir: Path, user_shell: str) -> None:
    line = tried(shell_demo, "echo")
    assert line.endswith("; echo 'uname -a' | subres console demo")
    done = subprocess.run(
        [user_shell, "-c", line],
        capture_output=True,
        env=_env(workdir),
        timeout=CLI_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert os.uname().sysname.encode() + b" " in done.stdout
    # No bracketed-paste codes in output read through a pipe.
    assert b"\x1b[?2004" not in done.stdout


@pytest.mark.parametrize("user_shell", SHELLS)
def test_the_interactive_example_in_a_terminal(
    shell_demo: Demo, workdir: Path, user_shell: str
) -> None:
    line = tried(shell_demo, "console")
    child = pexpect.spawn(
        user_shell,
        ["-c", f'{line}; echo "rc=$?"'],
        env=_env(workdir),
        timeout=EXPECT_TIMEOUT,
        dimensions=(24, 80),
    )
    try:
        child.expect_exact(b"Escape with Ctrl+]")
        child.sendline("echo sum-$((20+22))")
        child.expect_exact(b"sum-42")
        child.send(b"\x1d")
        child.expect(rb"rc=(\d+)")
        assert child.match.group(1) == b"0"
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)


def test_the_port_forward_example_reaches_the_machines_page(
    shell_demo: Demo, workdir: Path
) -> None:
    line = tried(shell_demo, "port-forward")
    assert re.search(r"; subres port-forward demo 8080:\d+$", line), line
    # 8080 may be taken on a shared machine: any free local port instead.
    forward = ["sh", "-c", tried(shell_demo, "port-forward", then="exec ").replace(" 8080:", " 0:")]
    with running(forward, env=_env(workdir)) as proc:
        local = read_until(proc, rb"Forwarding from 127\.0\.0\.1:(\d+) ", timeout=CLI_TIMEOUT)
        url = f"http://localhost:{int(local.group(1))}/"
        with urllib.request.urlopen(url, timeout=CLI_TIMEOUT) as answer:
            assert b"Hello from the demo machine" in answer.read()


def test_the_web_example_serves_the_page(shell_demo: Demo, workdir: Path) -> None:
    line = tried(shell_demo, "web", then="exec ")
    with running(["sh", "-c", f"{line} --port 0"], env=_env(workdir)) as proc:
        page = read_until(proc, rb"at (http://127\.0\.0\.1:\d+/ui/\S*)", timeout=CLI_TIMEOUT)
        assert b"?machine=default/demo#token=" in page.group(1)
        with urllib.request.urlopen(page.group(1).decode(), timeout=CLI_TIMEOUT) as answer:
            assert b"<html" in answer.read()


def test_the_screenshot_and_vnc_examples(shell_demo: Demo, workdir: Path) -> None:
    env = _env(workdir)
    shot = subprocess.run(
        ["sh", "-c", tried(shell_demo, "screenshot")],
        cwd=workdir,
        capture_output=True,
        env=env,
        timeout=CLI_TIMEOUT,
        check=False,
    )
    assert shot.returncode == 0, shot.stderr
    assert (workdir / "demo.png").read_bytes().startswith(b"\x89PNG")
    viewer = shlex.quote("true {address} {port}")
    vnc = subprocess.run(
        ["sh", "-c", f"{tried(shell_demo, 'vnc')} --viewer {viewer}"],
        capture_output=True,
        env=env,
        timeout=CLI_TIMEOUT,
        check=False,
    )
    assert vnc.returncode == 0, vnc.stderr


def _shell(line: str, home: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["sh", "-c", line], capture_output=True, env=_env(home), timeout=CLI_TIMEOUT, check=False
    )


def test_the_recordings_example_lists_the_console_sessions_and_says_how_to_play_one(
    shell_demo: Demo, workdir: Path
) -> None:
    assert _shell(tried(shell_demo, "echo"), workdir).returncode == 0
    listed = _shell(tried(shell_demo, "recordings"), workdir)
    assert listed.returncode == 0, listed.stderr
    name = listed.stdout.split(b"\n")[1].split()[0].decode()
    assert name.endswith(".cast")
    hint = listed.stderr.decode()
    assert f"subres recordings demo {name} --file - | subres replay -" in hint
    played = _shell(f"{exported(shell_demo)}; {hint.split(': ', 1)[1].strip()}", workdir)
    assert played.returncode == 0, played.stderr
    assert os.uname().sysname.encode() in played.stdout  # what `uname -a` printed


def test_the_example_meant_to_fail_says_so_and_fails_as_it_says(
    shell_demo: Demo, workdir: Path, kubectl_bin: Path
) -> None:
    [marked] = [line for line in shell_demo.banner.splitlines() if "meant to fail" in line]
    assert "/machines/stopped/console" in marked and "(409)" in marked
    path = f"export PATH={kubectl_bin.parent}:$PATH"
    done = _shell(f"{exported(shell_demo)}; {path}; {marked.strip()}", workdir)
    assert done.returncode == 1
    assert b"Error from server (Conflict)" in done.stderr
