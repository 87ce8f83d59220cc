"""`subres console` under the server's rules: the time a limit leaves, and moderating."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.cli.conftest import CLI_TIMEOUT, cli, cli_env
from tests.consoles import closed, stdout_until
from tests.support import Backend, machine, start_standalone

V5 = "v5.channel.k8s.io"


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


async def test_a_moderator_watches_and_ends_a_moderated_console_from_the_cli(
    tmp_path: Path,
) -> None:
    serial = await Backend().start_tcp()
    vm1 = machine("vm1", console=serial.url)
    policy = {"name": "all", "moderators": {"groups": ["ops"]}}  # alice is in ops
    async with (
        start_standalone(tmp_path, vm1, config={"moderation": [policy]}) as subres,
        subres.websocket(subres.url("vm1"), V5, user="bob") as bob,
    ):
        await stdout_until(bob, b"what you type is dropped until then]\r\n")
        watcher = await asyncio.create_subprocess_exec(
            *cli("--kubeconfig", subres.kubeconfig(), "console", "vm1", "--moderate"),
            stdin=asyncio.subprocess.PIPE,  # held open: she watches until stopped
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=cli_env(tmp_path),
        )
        await stdout_until(bob, b"alice moderating; the session starts]\r\n")
        ended = await asyncio.create_subprocess_exec(
            *cli("--kubeconfig", subres.kubeconfig(), "console", "vm1", "--moderate", "--end"),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=cli_env(tmp_path),
        )
        async with asyncio.timeout(CLI_TIMEOUT):
            _, err = await ended.communicate()
        assert ended.returncode == 0, err
        assert err == b"alice ended the moderated console session of Machine default/vm1\n"
        assert await closed(bob) == (4006, "ended by the moderator alice")
        watcher.kill()
        await watcher.wait()
    await serial.stop()
