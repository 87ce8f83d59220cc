"""`--console NAME`: the CLI's verbs on one of a machine's several consoles.

Each console is an echo backend that tags what it sends back, so the
output says which console answered.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pexpect  # type: ignore[import-untyped]
import pytest

from tests.cli.conftest import CLI_TIMEOUT, cli, cli_env, run_cli_async
from tests.server.test_consoles import TWO_CONSOLES, tagged, two
from tests.support import Backend, Standalone, start_standalone

KEEP = {"subres.dev/keep-console": "true"}


def _greeting(hello: bytes, tag: bytes) -> Any:
    echo = tagged(tag)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(hello)
        await echo(reader, writer)

    return handle


@pytest.fixture
async def subres(tmp_path: Path) -> AsyncIterator[Standalone]:
    serials = (
        await Backend(handler=_greeting(b"serial0 up\n", b"[ttyS0]")).start_tcp(),
        await Backend(handler=_greeting(b"serial1 up\n", b"[ttyS1]")).start_tcp(),
    )
    async with start_standalone(
        tmp_path, two("vm1", serials), two("kept", serials, annotations=KEEP), config=TWO_CONSOLES
    ) as s:
        yield s
    await asyncio.gather(*(serial.stop() for serial in serials))


async def run(
    subres: Standalone, *args: str, stdin: bytes = b"", home: Path
) -> tuple[int, bytes, bytes]:
    done = await run_cli_async(["--kubeconfig", subres.kubeconfig(), *args], home=home, stdin=stdin)
    return done.returncode, done.stdout, done.stderr


async def test_console_picks_a_console_by_name(subres: Standalone, tmp_path: Path) -> None:
    code, out, err = await run(
        subres, "console", "vm1", "--console", "serial1", stdin=b"hello\n", home=tmp_path
    )
    assert (code, out) == (0, b"serial1 up\n[ttyS1]hello\n"), err
    code, out, _ = await run(subres, "console", "vm1", stdin=b"hello\n", home=tmp_path)
    assert (code, out) == (0, b"serial0 up\n[ttyS0]hello\n")
    code, _, err = await run(subres, "console", "vm1", "--console", "sol", home=tmp_path)
    assert code == 1
    assert err.startswith(
        b"Error from server (BadRequest): Machine default/vm1 has no console 'sol' "
        b"(its consoles: serial0, serial1)"
    ), err


async def test_logs_reads_the_console_named(subres: Standalone, tmp_path: Path) -> None:
    # Each kept console printed its greeting when the keeper connected.
    async with asyncio.timeout(CLI_TIMEOUT):
        while True:
            _, out, _ = await run(subres, "logs", "kept", "--console", "serial1", home=tmp_path)
            if out:
                break
            await asyncio.sleep(0.05)  # nothing signals the keeper's delivery to another process
    assert out == b"serial1 up\n"
    assert (await run(subres, "logs", "kept", home=tmp_path))[1] == b"serial0 up\n"


async def test_the_takeover_question_is_about_the_console_picked(
    subres: Standalone, tmp_path: Path
) -> None:
    async def spawn(*flags: str) -> Any:
        argv = cli("--kubeconfig", subres.kubeconfig(), "console", "vm1", *flags)
        env = cli_env(tmp_path)
        return pexpect.spawn(argv[0], argv[1:], env=env, timeout=CLI_TIMEOUT, dimensions=(24, 80))

    async def expect(child: Any, pattern: object) -> None:
        await asyncio.to_thread(child.expect, pattern)

    bob = subres.websocket(subres.url("vm1") + "?console=serial1", "v5.channel.k8s.io", user="bob")
    async with bob:
        # bob writes on serial1: the default console is free, nobody is asked.
        free = await spawn()
        try:
            await expect(free, "Connected to machine/vm1")
        finally:
            free.close(force=True)
        held = await spawn("--console", "serial1")
        try:
            await expect(held, rb"In use by bob since \d\d:\d\d .+ take over\? \[y/N/o\(bserve\)\]")
            held.sendline("")
            await expect(held, "left the console of machine/vm1 to bob")
        finally:
            held.close(force=True)
