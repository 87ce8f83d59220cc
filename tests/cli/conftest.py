"""Fixtures for the client tests: scratch directories, the real demo server, running the CLI."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.server.portforward_support import UdpEcho, pf_machine, port_of, sha_on_eof
from tests.support import Backend, Standalone, start_standalone

START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
CLI_TIMEOUT = 30.0
DEAD_PORT = 1
"""A loopback port nothing listens on (below 1024, so no test server takes it)."""


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A scratch directory removed after the test."""
    with tempfile.TemporaryDirectory(prefix="subres-cli-") as tmp:
        yield Path(tmp)


@dataclass(frozen=True)
class Demo:
    """A running `subres demo`."""

    url: str
    kubeconfig: Path
    state_dir: Path
    banner: str = ""
    """Everything it printed on start, down to the last line of "Try:"."""


def cli_env(home: Path) -> dict[str, str]:
    """The environment for a CLI process: no developer kubeconfig, a scratch HOME."""
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env["HOME"] = str(home)
    return env


def cli(*args: str | Path) -> list[str]:
    """The argv that runs our command."""
    return [sys.executable, "-m", "subres", *map(str, args)]


def run_cli(
    args: Sequence[str | Path], *, home: Path, stdin: bytes = b""
) -> subprocess.CompletedProcess[bytes]:
    """Run the CLI with `stdin` piped in; bounded."""
    return subprocess.run(
        cli(*args),
        input=stdin,
        capture_output=True,
        env=cli_env(home),
        timeout=CLI_TIMEOUT,
        check=False,
    )


async def run_cli_async(
    args: Sequence[str | Path], *, home: Path, stdin: bytes = b"", path: str | None = None
) -> subprocess.CompletedProcess[bytes]:
    """`run_cli` without blocking the event loop (a server in this test's loop must answer);
    `path` replaces PATH."""
    proc = await asyncio.create_subprocess_exec(
        *cli(*args),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**cli_env(home), **({"PATH": path} if path else {})},
    )
    async with asyncio.timeout(CLI_TIMEOUT):
        out, err = await proc.communicate(stdin)
    assert proc.returncode is not None
    return subprocess.CompletedProcess(cli(*args), proc.returncode, out, err)


def read_until(
    proc: subprocess.Popen[bytes], pattern: bytes, *, timeout: float, stream: str = "stdout"
) -> re.Match[bytes]:
    """Read `proc`'s stdout (or stderr) until `pattern` matches; fail after `timeout`."""
    pipe = getattr(proc, stream)
    assert pipe is not None
    seen = b""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(pipe, selectors.EVENT_READ)
        while (match := re.search(pattern, seen)) is None:
            left = deadline - time.monotonic()
            if left <= 0 or not selector.select(left):
                raise AssertionError(f"no {pattern!r} within {timeout}s; got {seen!r}")
            chunk = os.read(pipe.fileno(), 65536)
            if not chunk:
                raise AssertionError(f"{stream} ended before {pattern!r}; got {seen!r}")
            seen += chunk
    return match


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM `proc`, wait a bounded time, then kill it."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(STOP_TIMEOUT)


@contextlib.contextmanager
def running(
    argv: Sequence[str], *, env: dict[str, str], cwd: Path | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """`argv` with stdout and stderr piped; stopped, and its pipes closed, afterwards."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd)
    try:
        yield proc
    finally:
        stop(proc)
        for pipe in (proc.stdout, proc.stderr):
            assert pipe is not None
            pipe.close()


@contextlib.contextmanager
def running_demo(
    *args: str, shell: str = "/bin/sh", before: Sequence[str] = (), path: str | None = None
) -> Iterator[Demo]:
    """`subres BEFORE demo ARGS` on a free port with `shell` as the machine's console
    (and `path` as its PATH, when given)."""
    with tempfile.TemporaryDirectory(prefix="subres-demo-") as tmp:
        state = Path(tmp)
        env = {**cli_env(state), "SHELL": shell, **({"PATH": path} if path else {})}
        with (state / "server.log").open("wb") as log:
            proc = subprocess.Popen(
                cli(*before, "demo", "--state-dir", state, "--port", "0", *args),
                stdout=subprocess.PIPE,
                stderr=log,
                env=env,
            )
        try:
            match = read_until(
                proc,
                rb"(?s)serving on (https://127\.0\.0\.1:\d+).*Try:\n.*meant to fail[^\n]*\n",
                timeout=START_TIMEOUT,
            )
            yield Demo(match.group(1).decode(), state / "kubeconfig", state, match[0].decode())
        finally:
            stop(proc)
            assert proc.stdout is not None
            proc.stdout.close()


@pytest.fixture(scope="module")
def demo() -> Iterator[Demo]:
    """A demo shared by a module's tests that leave its machines as they are."""
    with running_demo() as running:
        yield running


def write_kubeconfig(
    path: Path,
    *,
    server: str,
    user: dict[str, object] | None = None,
    cluster: dict[str, object] | None = None,
    namespace: str | None = None,
) -> Path:
    """A one-context kubeconfig named `test`."""
    context: dict[str, object] = {"cluster": "test", "user": "test"}
    if namespace:
        context["namespace"] = namespace
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {"server": server, **(cluster or {})}}],
        "users": [{"name": "test", "user": user or {}}],
        "contexts": [{"name": "test", "context": context}],
        "current-context": "test",
    }
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture
async def backends() -> AsyncIterator[tuple[Backend, Backend]]:
    """An echo backend and one answering the sha256 of all it got after EOF."""
    echo = await Backend().start_tcp()
    summer = await Backend(handler=sha_on_eof).start_tcp()
    yield echo, summer
    await echo.stop()
    await summer.stop()


@pytest.fixture
async def udp() -> AsyncIterator[UdpEcho]:
    """A UDP echo."""
    u = await UdpEcho().start()
    yield u
    u.stop()


@pytest.fixture
async def subres(
    tmp_path: Path, backends: tuple[Backend, Backend], udp: UdpEcho
) -> AsyncIterator[Standalone]:
    """A standalone server whose machine vm1 allows the ports of `backends` and `udp`, and
    `DEAD_PORT`, where nothing listens."""
    ports = [port_of(b.url) for b in backends] + [udp.port, DEAD_PORT]
    async with start_standalone(tmp_path, pf_machine("vm1", ports)) as s:
        yield s
