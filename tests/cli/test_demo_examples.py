"""Every command `subres demo` prints under "Try:" works, under bash and sh, piped and in a PTY.

The machine's shell is bash in one demo and sh in the other; each printed
line is run as printed by `bash -c` and `sh -c` (the user's shell). Only a
listening port is changed where a fixed one could be taken on a shared
machine (8080, 8070), and vnc gets a viewer that exits at once.
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


def tried(demo: Demo, verb: str) -> str:
    """The "Try:" line that runs `verb`, without its trailing remark in parentheses."""
    for line in demo.banner.split("Try:", 1)[1].splitlines():
        if f" {verb} " in f"{line} ":
            return re.sub(r"\s+\(.*\)$", "", line.strip())
    raise AssertionError(f"no {verb} line in {demo.banner}")


@pytest.mark.parametrize("user_shell", SHELLS)
def test_the_piped_example(shell_demo: Demo, workdir: Path, user_shell: str) -> None:
    line = tried(shell_demo, "echo")
    assert line.startswith("echo 'uname -a' | subres --kubeconfig ")
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
    assert re.search(r" port-forward demo 8080:\d+$", line), line
    # 8080 may be taken on a shared machine: any free local port instead.
    forward = ["sh", "-c", "exec " + line.replace(" 8080:", " 0:")]
    with running(forward, env=_env(workdir)) as proc:
        local = read_until(proc, rb"Forwarding from 127\.0\.0\.1:(\d+) ", timeout=CLI_TIMEOUT)
        url = f"http://localhost:{int(local.group(1))}/"
        with urllib.request.urlopen(url, timeout=CLI_TIMEOUT) as answer:
            assert b"Hello from the demo machine" in answer.read()


def test_the_web_example_serves_the_page(shell_demo: Demo, workdir: Path) -> None:
    line = tried(shell_demo, "web")
    with running(["sh", "-c", f"exec {line} --port 0"], env=_env(workdir)) as proc:
        page = read_until(proc, rb"at (http://127\.0\.0\.1:\d+/ui/\S*)", timeout=CLI_TIMEOUT)
        assert page.group(1).endswith(b"?machine=default/demo")
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
