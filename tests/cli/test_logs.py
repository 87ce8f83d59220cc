"""`subres logs`: a kept console's output printed as `kubectl logs` prints a pod's.

The real CLI runs as a process against a standalone server in this test's
event loop; the console is an echo backend that prints what the test says.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.cli.conftest import CLI_TIMEOUT, cli, cli_env, run_cli_async
from tests.consoles import Console
from tests.support import Backend, Standalone, machine, start_standalone

KEEP = {"subres.dev/keep-console": "true"}


@pytest.fixture
async def subres(tmp_path: Path, console: Console) -> AsyncIterator[Standalone]:
    serial = await Backend(handler=console.handle).start_tcp()
    vm1 = machine("vm1", console=serial.url, annotations=KEEP)
    async with start_standalone(tmp_path, vm1, machine("plain", console=serial.url)) as s:
        await serial.wait_open(1)
        yield s
    await serial.stop()


@pytest.fixture
def console() -> Console:
    return Console()


async def logs(subres: Standalone, *args: str, home: Path) -> tuple[int, bytes, bytes]:
    done = await run_cli_async(["--kubeconfig", subres.kubeconfig(), "logs", *args], home=home)
    return done.returncode, done.stdout, done.stderr


async def printed(subres: Standalone, console: Console, text: bytes, home: Path) -> None:
    """Have the console print `text` and wait until the log holds it."""
    await console.say(text)
    async with asyncio.timeout(CLI_TIMEOUT):
        # Nothing signals the keeper's delivery to another process.
        while text not in (await logs(subres, "vm1", home=home))[1]:  # noqa: ASYNC110
            await asyncio.sleep(0.05)


async def test_logs_prints_the_kept_output_and_its_tail(
    subres: Standalone, console: Console, tmp_path: Path
) -> None:
    await printed(subres, console, b"one\r\ntwo\r\nthree\r\n", tmp_path)
    assert await logs(subres, "vm1", home=tmp_path) == (0, b"one\r\ntwo\r\nthree\r\n", b"")
    assert (await logs(subres, "vm1", "--tail", "1", home=tmp_path))[1] == b"three\r\n"
    assert (await logs(subres, "machine/vm1", "--limit-bytes", "3", home=tmp_path))[1] == b"one"
    code, out, _ = await logs(subres, "vm1", "--timestamps", "--since", "1h", home=tmp_path)
    assert code == 0 and len(re.findall(rb"(?m)^\d{4}-\d\d-\d\dT\S+Z ", out)) == 3, out


async def test_logs_f_follows_like_kubectl_logs(
    subres: Standalone, console: Console, tmp_path: Path
) -> None:
    await printed(subres, console, b"booted\n", tmp_path)
    proc = await asyncio.create_subprocess_exec(
        *cli("--kubeconfig", subres.kubeconfig(), "logs", "vm1", "-f", "--tail", "20"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=cli_env(tmp_path),
    )
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(CLI_TIMEOUT):
            assert await proc.stdout.readline() == b"booted\n"
            await console.say(b"login: ")
            assert await proc.stdout.readexactly(7) == b"login: "
        # The machine no longer keeps its console: the log ends, and so does the command.
        subres.write_machines(machine("vm1", console="tcp://127.0.0.1:9"))
        async with asyncio.timeout(CLI_TIMEOUT):
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_a_console_not_kept_is_refused_as_kubectl_would(
    subres: Standalone, tmp_path: Path
) -> None:
    code, out, err = await logs(subres, "plain", home=tmp_path)
    assert (code, out) == (1, b"")
    assert err.startswith(
        b"Error from server (BadRequest): Machine default/plain: the console is not kept"
    ), err
    code, _, err = await logs(subres, "vm1", "--since", "5s", "--since-time", "x", home=tmp_path)
    assert code == 1 and b"at most one of --since and --since-time" in err
