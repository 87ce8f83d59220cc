"""Bad input and vanishing clients never crash the server or leak a task or a socket."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import websockets
from websockets.asyncio.client import connect

from tests.support import Backend, Standalone, machine, open_fds, start_standalone, wait_for
from tests.wsframes import client_frame, read_frame


@pytest.fixture
async def subres(tmp_path: Path, backend: Backend) -> AsyncIterator[Standalone]:
    async with start_standalone(
        tmp_path, machine("vm1", console=backend.url), session={"maxMessage": 1 << 16}
    ) as s:
        yield s


def path(subres: Standalone) -> str:
    return subres.url("vm1").split(str(subres.server.port), 1)[1]


async def raw(subres: Standalone) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(
        "127.0.0.1", subres.server.port, ssl=subres.client_ssl, server_hostname="localhost"
    )


def upgrade(
    subres: Standalone, http: str = "HTTP/1.1", target: str = "", **overrides: str | None
) -> bytes:
    """A WebSocket upgrade request for `target` (default: vm1's console)."""
    headers: dict[str, str | None] = {
        "Host": "localhost",
        "Upgrade": "websocket",
        "Connection": "Upgrade",
        "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode(),
        "Sec-WebSocket-Version": "13",
        "Authorization": f"Bearer {subres.token}",
    }
    headers.update(overrides)
    lines = [f"GET {target or path(subres)} {http}"]
    lines += [f"{k}: {v}" for k, v in headers.items() if v is not None]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def status_line(reader: asyncio.StreamReader) -> bytes:
    async with asyncio.timeout(5):
        head = await reader.readuntil(b"\r\n\r\n")
    return head.split(b"\r\n", 1)[0]


@pytest.mark.parametrize(
    ("override", "code"),
    [
        ({"Sec-WebSocket-Key": None}, b"400"),
        ({"Upgrade": "h2c"}, b"400"),
        ({"Sec-WebSocket-Key": "short"}, b"400"),
        ({"http": "HTTP/1.0"}, b"400"),
        # RFC 6455 4.4: another version is 426 naming the one we speak (aiohttp took 7 and 8).
        ({"Sec-WebSocket-Version": "99"}, b"426"),
        ({"Sec-WebSocket-Version": "8"}, b"426"),
        ({"Sec-WebSocket-Version": "7"}, b"426"),
    ],
)
async def test_malformed_upgrades_are_refused_without_backend(
    subres: Standalone, backend: Backend, override: dict[str, str], code: bytes
) -> None:
    reader, writer = await raw(subres)
    writer.write(upgrade(subres, **override))
    async with asyncio.timeout(5):
        head = await reader.readuntil(b"\r\n\r\n")
    assert code in head.split(b"\r\n", 1)[0]
    if code == b"426":
        assert b"\r\nSec-WebSocket-Version: 13\r\n" in head
    writer.close()
    assert backend.accepted == 0


@pytest.mark.parametrize(
    "bad_frame",
    [
        client_frame(0x3, b"reserved opcode"),
        client_frame(0x2, b"x" * (1 << 17)),
        client_frame(0x2, b"rsv bits", rsv=0b100),
        client_frame(0x9, b"p" * 200),
        client_frame(0x8, b"\x03\xe8") + b"garbage after close" * 100,
        b"\x82\xff" + b"\xff" * 8 + os.urandom(64),
    ],
    ids=["opcode", "oversized", "rsv", "bigping", "after-close", "huge-length"],
)
async def test_bad_frames_close_the_session_and_leak_nothing(
    subres: Standalone, backend: Backend, bad_frame: bytes
) -> None:
    tasks, fds = len(asyncio.all_tasks()), open_fds()
    reader, writer = await raw(subres)
    writer.write(upgrade(subres))
    assert b"101" in await status_line(reader)
    await backend.wait_open(1)
    writer.write(bad_frame)
    async with asyncio.timeout(5):
        rest = await reader.read()  # the server closes the connection
    assert rest[:1] in (b"\x88", b"")  # a close frame, if anything
    writer.close()
    await backend.wait_open(0)
    await wait_for(lambda: len(subres.server.state.sessions) == 0)
    await wait_for(lambda: len(asyncio.all_tasks()) <= tasks and open_fds() <= fds)


async def test_vanishing_clients_leave_nothing_behind(subres: Standalone, backend: Backend) -> None:
    tasks, fds = len(asyncio.all_tasks()), open_fds()
    for _ in range(20):
        reader, writer = await raw(subres)
        writer.write(upgrade(subres))
        assert b"101" in await status_line(reader)
        writer.write(client_frame(0x2, os.urandom(4000)))
        await writer.drain()
        # No close frame, no TLS close_notify: the TCP connection just goes.
        writer.transport.abort()
    await backend.wait_open(0)
    await wait_for(lambda: len(subres.server.state.sessions) == 0)
    await wait_for(lambda: len(asyncio.all_tasks()) <= tasks and open_fds() <= fds)


async def test_slow_client_does_not_grow_server_memory(
    tmp_path: Path,
) -> None:
    """A backend that floods a client that never reads gets pushed back on."""
    sent = 0
    blocked = asyncio.Event()

    async def flood(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal sent
        chunk = b"x" * 65536
        while True:
            writer.write(chunk)
            sent += len(chunk)
            try:
                async with asyncio.timeout(0.5):
                    await writer.drain()
            except TimeoutError:
                blocked.set()
                await writer.drain()

    backend = await Backend(handler=flood).start_tcp()
    try:
        async with start_standalone(tmp_path, machine("vm1", console=backend.url)) as subres:
            reader, writer = await raw(subres)
            writer.write(upgrade(subres))
            assert b"101" in await status_line(reader)
            # Never read: the kernel buffers, then the server, then the backend must stall.
            async with asyncio.timeout(20):
                await blocked.wait()
            stalled_at = sent
            assert stalled_at < 64 << 20
            writer.transport.abort()
            await backend.wait_open(0)
    finally:
        await backend.stop()


async def test_server_survives_and_serves_after_abuse(subres: Standalone) -> None:
    for junk in (b"\x16\x03\x01\x00\x05hello", b"GET / HTTP/1.1\r\n\r\n", os.urandom(300)):
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", subres.server.port)
            writer.write(junk)
            await writer.drain()
            async with asyncio.timeout(5):
                await reader.read()
            writer.close()
        except (OSError, ssl.SSLError):
            pass
    async with connect(
        subres.url("vm1"), ssl=subres.client_ssl, additional_headers=subres.auth
    ) as ws:
        await ws.send(b"alive")
        assert await ws.recv() == b"alive"


async def test_shutdown_tells_clients_the_server_is_going_away(tmp_path: Path) -> None:
    backend = await Backend().start_tcp()
    try:
        async with start_standalone(tmp_path, machine("vm1", console=backend.url)) as subres:
            ws = await connect(
                subres.url("vm1"), ssl=subres.client_ssl, additional_headers=subres.auth
            )
            await subres.server.stop()
            with pytest.raises(websockets.ConnectionClosed):
                async with asyncio.timeout(5):
                    await ws.recv()
            assert ws.close_code == 1001
            await backend.wait_open(0)
    finally:
        await backend.stop()


async def test_pings_keep_an_answering_client_and_drop_a_silent_one(
    tmp_path: Path, backend: Backend
) -> None:
    async with start_standalone(
        tmp_path, machine("vm1", console=backend.url), session={"pingInterval": 0.2}
    ) as subres:
        reader, writer = await raw(subres)
        writer.write(upgrade(subres))
        assert b"101" in await status_line(reader)
        async with asyncio.timeout(5):
            for _ in range(3):  # answer three pings: the session must stay
                opcode, payload = await read_frame(reader)
                assert opcode == 0x9
                writer.write(client_frame(0xA, payload))
            writer.write(client_frame(0x2, b"still here"))
            while (frame := await read_frame(reader)) != (0x2, b"still here"):
                assert frame[0] == 0x9
                writer.write(client_frame(0xA, frame[1]))
            # Now fall silent: the server must give up on us and release the backend.
            # A peer that stopped answering gets no close handshake, just the hang-up.
            with contextlib.suppress(asyncio.IncompleteReadError):
                while (await read_frame(reader))[0] != 0x8:
                    pass
        await backend.wait_open(0)
        await wait_for(lambda: len(subres.server.state.sessions) == 0)
        writer.close()
