"""`subres console` under a limit: it says how long is left, then why the session ended."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.cli.conftest import CLI_TIMEOUT, cli, cli_env
from tests.support import Backend, machine, start_standalone


async def test_the_console_says_the_time_left_and_why_it_ended(tmp_path: Path) -> None:
    serial = await Backend().start_tcp()
    rule = {"name": "short", "users": ["alice"], "maxSessionDuration": "2s"}
    async with start_standalone(
        tmp_path, machine("vm1", console=serial.url), config={"limits": [rule]}
    ) as subres:
        proc = await asyncio.create_subprocess_exec(
            *cli("--kubeconfig", subres.kubeconfig(), "console", "vm1"),
            stdin=asyncio.subprocess.PIPE,  # held open: the session lasts until the limit
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=cli_env(tmp_path),
        )
        async with asyncio.timeout(CLI_TIMEOUT):
            _, err = await proc.communicate()
    await serial.stop()
    lines = err.decode().splitlines()
    assert lines[0] == "machine/vm1: the session ends in 2s: its maximum duration"
    assert lines[-1] == (
        "error: the server closed the console (4004): "
        "the session reached its maximum duration of 2s (limit short)"
    )
    assert proc.returncode == 1
