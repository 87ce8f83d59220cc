"""`subres console` and `subres port-forward` through a real server that shuts down and returns.

Server A (a real `subres serve` child) drains on SIGTERM: its sessions get
close code 1001. Server B then starts on the same port with the same files,
as the pod that replaces it in a rollout (or another replica behind the same
Service would be). The CLI reconnects by itself and says so on stderr;
`--no-reconnect` ends it instead.
"""

from __future__ import annotations

import asyncio
import re
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.cli.conftest import cli, cli_env, write_kubeconfig
from tests.server.portforward_support import port_of
from tests.support import Backend, ServeProcess, end_process, free_port, machine, serve_process

WAIT = 30.0
"""Bound on each expected line: a reconnection waits out its backoff for server B."""


def vm1(backend: Backend) -> dict[str, Any]:
    """Machine vm1: its console and its one forwardable port are the echo backend."""
    forward = {"portForward": {"address": "127.0.0.1", "ports": [port_of(backend.url)]}}
    return machine("vm1", console=backend.url, status=forward)


@asynccontextmanager
async def the_cli(tmp: Path, server: ServeProcess, *args: str) -> AsyncIterator[Any]:
    """Our CLI with `args` against `server`, its three streams piped; ended by PID after."""
    config = write_kubeconfig(
        tmp / "kubeconfig",
        server=server.base,
        user={"token": server.token},
        cluster={"certificate-authority": str(tmp / "certs" / "ca.crt")},
    )
    proc = await asyncio.create_subprocess_exec(
        *cli("--kubeconfig", config, *args),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=cli_env(tmp),
    )
    try:
        yield proc
    finally:
        await end_process(proc, signal.SIGINT)


async def expect(stream: asyncio.StreamReader | None, pattern: str) -> re.Match[str]:
    """Read lines of `stream` until one matches `pattern`."""
    assert stream is not None
    seen = []
    async with asyncio.timeout(WAIT):
        while line := (await stream.readline()).decode():
            seen.append(line)
            if found := re.search(pattern, line):
                return found
    raise AssertionError(f"no {pattern!r} in {seen!r}")


async def shut_down(server: ServeProcess) -> None:
    """SIGTERM, as the kubelet sends it; the drain ends every session with 1001."""
    server.proc.send_signal(signal.SIGTERM)
    async with asyncio.timeout(WAIT):
        assert await server.proc.wait() == 0


async def echoes(port: int, data: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A local connection to a forwarded `port` that echoed `data`; still open."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    async with asyncio.timeout(WAIT):
        assert await reader.readexactly(len(data)) == data
    return reader, writer


async def test_console_reconnects_to_the_server_that_replaced_the_one_shutting_down(
    tmp_path: Path, backend: Backend
) -> None:
    port = free_port()
    async with (
        serve_process(tmp_path, vm1(backend), delay=0, grace=2, port=port) as a,
        the_cli(tmp_path, a, "console", "vm1") as console,
    ):
        assert console.stdin is not None
        console.stdin.write(b"before\n")
        await expect(console.stdout, "^before$")
        await shut_down(a)
        await expect(
            console.stderr, r"^machine/vm1: the server is shutting down \(1001\); reconnecting"
        )
        async with serve_process(tmp_path, vm1(backend), delay=0, grace=2, port=port):
            await expect(console.stderr, r"^Reconnected to machine/vm1\.$")
            console.stdin.write(b"after\n")
            await expect(console.stdout, "^after$")
            console.stdin.close()  # v5: stdin ends, the echo ends, the console ends
            async with asyncio.timeout(WAIT):
                assert await console.wait() == 0


@pytest.mark.parametrize("transport", ["websocket", "spdy"])
async def test_port_forward_goes_on_through_the_server_that_replaced_the_one_shutting_down(
    tmp_path: Path, backend: Backend, transport: str
) -> None:
    port, remote = free_port(), port_of(backend.url)
    async with serve_process(tmp_path, vm1(backend), delay=0, grace=2, port=port) as a:
        args = ("port-forward", "vm1", f"0:{remote}", "--transport", transport)
        async with the_cli(tmp_path, a, *args) as forward:
            local = int((await expect(forward.stdout, r"127\.0\.0\.1:(\d+) ->")).group(1))
            reader, writer = await echoes(local, b"before")
            await shut_down(a)
            async with asyncio.timeout(WAIT):
                assert await reader.read() == b""  # that connection could not be carried over
            writer.close()
            said = {
                "websocket": rf"^port {remote}/tcp: the server is shutting down \(1001\); "
                "the next connection connects again$",
                "spdy": r"^the SPDY connection to the server ended; reconnecting$",
            }
            await expect(forward.stderr, said[transport])
            async with serve_process(tmp_path, vm1(backend), delay=0, grace=2, port=port):
                if transport == "spdy":  # dialled again at once, not at the next connection
                    await expect(forward.stderr, r"^Reconnected to machine/vm1\.$")
                _, writer = await echoes(local, b"after")
                writer.close()
            assert forward.returncode is None, "port-forward ended"


async def test_port_forward_without_reconnect_ends_with_the_server(
    tmp_path: Path, backend: Backend
) -> None:
    port, remote = free_port(), port_of(backend.url)
    async with serve_process(tmp_path, vm1(backend), delay=0, grace=2, port=port) as a:
        args = ("port-forward", "vm1", f"0:{remote}", "--no-reconnect")
        async with the_cli(tmp_path, a, *args) as forward:
            local = int((await expect(forward.stdout, r"127\.0\.0\.1:(\d+) ->")).group(1))
            _, writer = await echoes(local, b"before")
            await shut_down(a)
            async with asyncio.timeout(WAIT):
                assert await forward.wait() == 1
            assert forward.stderr is not None
            said = (await forward.stderr.read()).decode()
            writer.close()
    assert said == f"error: port {remote}/tcp: the server is shutting down (1001)\n"


async def test_a_port_forward_connection_made_while_the_server_is_away_waits_for_it(
    tmp_path: Path, backend: Backend
) -> None:
    port, remote = free_port(), port_of(backend.url)
    async with (
        serve_process(tmp_path, vm1(backend), delay=0, grace=2, port=port) as a,
        the_cli(tmp_path, a, "port-forward", "vm1", f"0:{remote}") as forward,
    ):
        local = int((await expect(forward.stdout, r"127\.0\.0\.1:(\d+) ->")).group(1))
        await shut_down(a)
        # Nothing listens at the server's address now: the connection waits, not fails.
        reader, writer = await asyncio.open_connection("127.0.0.1", local)
        writer.write(b"while away")
        async with serve_process(tmp_path, vm1(backend), delay=0, grace=2, port=port):
            async with asyncio.timeout(WAIT):
                assert await reader.readexactly(10) == b"while away"
        writer.close()
        assert forward.returncode is None, "port-forward ended"
