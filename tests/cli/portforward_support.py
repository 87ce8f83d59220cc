"""Shared pieces of the `subres port-forward` tests: running the CLI and talking through it."""

from __future__ import annotations

import asyncio
import hashlib
import re

from tests.cli.conftest import cli, cli_env
from tests.server.portforward_support import chunks
from tests.support import Standalone, end_process

__all__ = ["TIMEOUT", "echo_hashed", "listening", "round_trip", "spawn", "stderr_of", "stop"]

TIMEOUT = 30.0


async def spawn(
    subres: Standalone, *args: str, stdin: int | None = None
) -> asyncio.subprocess.Process:
    """`subres port-forward ARGS…` against `subres`, stdout and stderr piped."""
    return await asyncio.create_subprocess_exec(
        *cli("--kubeconfig", subres.kubeconfig(), "port-forward", *args),
        stdin=stdin if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=cli_env(subres.dir),
    )


async def stop(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM the CLI, wait a bounded time, then kill it."""
    await end_process(proc)


async def listening(proc: asyncio.subprocess.Process, count: int) -> list[int]:
    """The local ports the CLI announced, in order: each on 127.0.0.1, then on [::1]."""
    assert proc.stdout is not None
    ports: list[int] = []
    async with asyncio.timeout(TIMEOUT):
        while len(ports) < count:
            lines = [await proc.stdout.readline() for _ in range(2)]
            assert all(lines), f"no listener announced; stderr: {await stderr_of(proc)!r}"
            found = [
                re.match(rb"Forwarding from (127\.0\.0\.1|\[::1\]):(\d+) -> ", x) for x in lines
            ]
            assert all(found), lines
            assert [m.group(1) for m in found if m] == [b"127.0.0.1", b"[::1]"], lines
            (port,) = {int(m.group(2)) for m in found if m}
            ports.append(port)
    return ports


async def stderr_of(proc: asyncio.subprocess.Process) -> bytes:
    """Stop the CLI and return everything it wrote on stderr."""
    assert proc.stderr is not None
    await stop(proc)
    return await proc.stderr.read()


async def echo_hashed(port: int, size: int) -> str:
    """Send `chunks(size)` to an echo behind local `port`; the sha256 of what came back."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    async def send() -> None:
        for chunk in chunks(size):
            writer.write(chunk)
            await writer.drain()

    sender = asyncio.create_task(send())
    h = hashlib.sha256()
    got = 0
    async with asyncio.timeout(60):
        while got < size:
            data = await reader.read(1 << 20)
            assert data
            h.update(data)
            got += len(data)
        await sender
    writer.close()
    return h.hexdigest()


async def round_trip(port: int, payload: bytes) -> bytes:
    """Send `payload` and EOF through local `port`; all that came back before the end."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(payload)
        writer.write_eof()
        async with asyncio.timeout(TIMEOUT):
            return await reader.read()
    finally:
        writer.close()
