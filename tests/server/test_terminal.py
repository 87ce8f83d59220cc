"""Window sizes reach a backend that takes them, and its exit status reaches the client.

Sockets have no size and no exit status, so the backend here is a socket
wrapped the way a PTY or SSH backend is shaped: it records `resize` calls and
reports an `exit_code`. It replaces the dial for these tests only; the rest of
the path (dialects, SPDY streams, client-go's executors) is the real one.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from subres.backends import stream as sockets
from subres.engine.sockets import SocketStream
from subres.protocol.channels import TerminalSize
from subres.protocol.spdy import DataReceived, StreamReplied
from tests.engine.spdyclient import SpdyClient
from tests.server.kubepeer import machine_path, pf_machine, run_exec
from tests.support import Backend, Standalone, start_standalone


class TerminalBackend:
    """A socket backend with a window and an exit status."""

    def __init__(self, inner: SocketStream, exit_code: int | None) -> None:
        self.inner = inner
        self.exit_code = exit_code
        self.sizes: list[TerminalSize] = []
        self.resized = asyncio.Event()

    def resize(self, size: TerminalSize) -> None:
        self.sizes.append(size)
        self.resized.set()

    async def read(self) -> bytes:
        return await self.inner.read()

    async def write(self, data: bytes) -> None:
        await self.inner.write(data)

    async def write_eof(self) -> None:
        await self.inner.write_eof()

    async def close(self) -> None:
        await self.inner.close()


@pytest.fixture
def dialed(monkeypatch: pytest.MonkeyPatch) -> list[TerminalBackend]:
    """Every backend the server dials from now on, as a `TerminalBackend` exiting with 3."""
    made: list[TerminalBackend] = []
    real = sockets.dial

    async def dial(*args: Any, **kwargs: Any) -> TerminalBackend:
        made.append(TerminalBackend(await real(*args, **kwargs), exit_code=3))
        return made[-1]

    monkeypatch.setattr(sockets, "dial", dial)
    return made


@pytest.fixture
async def subres(tmp_path: Path, backend: Backend) -> AsyncIterator[Standalone]:
    async with start_standalone(tmp_path, pf_machine("vm1", [], console=backend.url)) as s:
        yield s


@pytest.mark.parametrize("transport", ["spdy", "websocket"])
async def test_client_go_exits_with_the_backends_exit_status(
    subres: Standalone, dialed: list[TerminalBackend], kubepeer_bin: Path, transport: str
) -> None:
    result = await run_exec(kubepeer_bin, subres, "vm1", b"hello", transport=transport)
    assert (result.code, result.stdout) == (3, b"hello"), result.stderr
    assert len(dialed) == 1


async def test_websocket_resizes_reach_the_backend_in_order(
    subres: Standalone, dialed: list[TerminalBackend]
) -> None:
    async with subres.websocket(subres.url("vm1"), "v5.channel.k8s.io") as conn:
        await conn.send(b"\x04" + b'{"Width":80,"Height":24}{"Width":132,"Height":43}')
        await conn.send(b"\x04not json")
        await conn.send(b"\x04" + b'{"Width":100,"Height":40}')
        await conn.send(b"\x00done")
        assert await conn.recv() == b"\x01"  # kubelet's hello on stdout
        assert await conn.recv() == b"\x01done"
        await conn.send(b"\xff\x00")  # v5: stdin closed
        status = await conn.recv()
    assert isinstance(status, bytes) and status[0] == 3
    assert json.loads(status[1:])["details"]["causes"] == [{"reason": "ExitCode", "message": "3"}]
    assert [(s.width, s.height) for s in dialed[0].sizes] == [(80, 24), (132, 43), (100, 40)]


async def test_spdy_resize_stream_reaches_the_backend(
    subres: Standalone, dialed: list[TerminalBackend]
) -> None:
    client = await SpdyClient.upgrade(subres, machine_path("vm1", "console"), "v4.channel.k8s.io")
    await client.open([("streamtype", "error")])
    await client.open([("streamtype", "stdin")])
    await client.open([("streamtype", "stdout")])
    resize_id = await client.open([("streamtype", "resize")])
    await client.expect(StreamReplied, stream_id=resize_id)
    await client.send(resize_id, b'{"Width":120,"Height":50}')
    async with asyncio.timeout(10):
        await dialed[0].resized.wait()
    assert [(s.width, s.height) for s in dialed[0].sizes] == [(120, 50)]
    await client.close()
    assert not any(isinstance(e, DataReceived) for e in client.events)
