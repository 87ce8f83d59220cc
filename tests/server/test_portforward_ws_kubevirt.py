"""KubeVirt-style `…/portforward/{port}[/{tcp|udp}]` against real clients and backends."""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import websockets
from websockets.asyncio.client import ClientConnection, connect

from tests.server.portforward_support import (
    BULK_SIZE,
    UdpEcho,
    chunks,
    digest,
    pf_machine,
    port_of,
)
from tests.support import Backend, Standalone, start_standalone

DEAD_PORT = 1
"""Allowed by the parent, but nothing listens on it."""


@pytest.fixture
async def udp() -> AsyncIterator[UdpEcho]:
    u = await UdpEcho().start()
    yield u
    u.stop()


@pytest.fixture
async def subres(
    tmp_path: Path, echo: Backend, summer: Backend, udp: UdpEcho
) -> AsyncIterator[Standalone]:
    ports = [port_of(echo.url), port_of(summer.url), udp.port, DEAD_PORT]
    async with start_standalone(
        tmp_path, pf_machine("vm1", ports), pf_machine("stopped", ports, phase="Stopped")
    ) as s:
        yield s


def ws_connect(subres: Standalone, path: str, *protocols: str) -> connect:
    return subres.websocket(subres.url("vm1", path), *protocols)


async def _send_all(ws: ClientConnection, size: int) -> None:
    for chunk in chunks(size):
        await ws.send(chunk)


async def _hash_until(ws: ClientConnection, size: int) -> str:
    h = hashlib.sha256()
    got = 0
    while got < size:
        message = await ws.recv()
        assert isinstance(message, bytes)
        h.update(message)
        got += len(message)
    assert got == size
    return h.hexdigest()


@pytest.mark.parametrize("protocols", [("plain.kubevirt.io",), ()], ids=["plain", "none"])
async def test_websockets_bulk_both_ways_hashed(
    subres: Standalone, echo: Backend, protocols: tuple[str, ...]
) -> None:
    started = time.monotonic()
    async with ws_connect(subres, f"portforward/{port_of(echo.url)}/tcp", *protocols) as ws:
        assert ws.subprotocol == (protocols[0] if protocols else None)
        sender = asyncio.create_task(_send_all(ws, BULK_SIZE))
        async with asyncio.timeout(120):
            echoed = await _hash_until(ws, BULK_SIZE)
            await sender
    elapsed = time.monotonic() - started
    rate = BULK_SIZE / elapsed / 1e6
    print(f"kubevirt websockets {BULK_SIZE >> 20} MiB each way: {rate:.0f} MB/s")
    assert echoed == digest(BULK_SIZE)
    await echo.wait_open(0)


async def test_aiohttp_bulk_both_ways_hashed(subres: Standalone, echo: Backend) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(
            subres.url("vm1", f"portforward/{port_of(echo.url)}"),
            ssl=subres.client_ssl,
            headers=subres.auth,
            protocols=("plain.kubevirt.io",),
            compress=0,
            max_msg_size=0,
        ) as ws,
    ):
        assert ws.protocol == "plain.kubevirt.io"

        async def send() -> None:
            for chunk in chunks(BULK_SIZE):
                await ws.send_bytes(chunk)

        sender = asyncio.create_task(send())
        h = hashlib.sha256()
        got = 0
        async with asyncio.timeout(120):
            while got < BULK_SIZE:
                data = await ws.receive_bytes()
                h.update(data)
                got += len(data)
            await sender
    assert h.hexdigest() == digest(BULK_SIZE)


async def test_client_close_is_eof_and_the_reply_still_arrives(
    subres: Standalone, summer: Backend
) -> None:
    payload = b"".join(chunks(3 << 20, seed=7))
    async with ws_connect(subres, f"portforward/{port_of(summer.url)}") as ws:
        for i in range(0, len(payload), 1 << 16):
            await ws.send(payload[i : i + (1 << 16)])
        closing = asyncio.create_task(ws.close())
        replies = []
        with pytest.raises(websockets.ConnectionClosedOK):
            async with asyncio.timeout(10):
                while True:
                    replies.append(await ws.recv())
        await closing
    assert replies == [hashlib.sha256(payload).hexdigest().encode()]
    assert ws.close_code == 1000
    assert "backend closed" in (ws.close_reason or "")
    await summer.wait_open(0)


async def test_backend_eof_closes_1000(tmp_path: Path) -> None:
    async def greet(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"SSH-2.0-fake\r\n")
        await writer.drain()

    backend = await Backend(handler=greet).start_tcp()
    try:
        port = port_of(backend.url)
        async with (
            start_standalone(tmp_path, pf_machine("vm1", [port])) as subres,
            ws_connect(subres, f"portforward/{port}") as ws,
        ):
            assert await asyncio.wait_for(ws.recv(), 5) == b"SSH-2.0-fake\r\n"
            with pytest.raises(websockets.ConnectionClosedOK):
                await asyncio.wait_for(ws.recv(), 5)
            assert ws.close_code == 1000
    finally:
        await backend.stop()


async def test_udp_datagrams_keep_order_and_boundaries(subres: Standalone, udp: UdpEcho) -> None:
    sizes = [1, 2, 512, 1400, 9000, 65507, *range(3, 200)]
    datagrams = [bytes([i % 251]) * n for i, n in enumerate(sizes)]
    async with ws_connect(subres, f"portforward/{udp.port}/udp") as ws:
        echoed = []
        async with asyncio.timeout(10):
            # One at a time for the big ones (a loopback burst could overflow a socket buffer).
            for datagram in datagrams[:6]:
                await ws.send(datagram)
                echoed.append(await ws.recv())
            for datagram in datagrams[6:]:
                await ws.send(datagram)
            for _ in datagrams[6:]:
                echoed.append(await ws.recv())
    assert echoed == datagrams
    assert udp.received == datagrams


async def test_udp_server_sends_several_datagrams_per_request(tmp_path: Path) -> None:
    udp = await UdpEcho(copies=3).start()
    try:
        async with (
            start_standalone(tmp_path, pf_machine("vm1", [udp.port])) as subres,
            ws_connect(subres, f"portforward/{udp.port}/udp") as ws,
        ):
            await ws.send(b"ping")
            replies = [await asyncio.wait_for(ws.recv(), 5) for _ in range(3)]
            assert replies == [b"ping"] * 3
    finally:
        udp.stop()


async def _status(subres: Standalone, path: str) -> tuple[int, dict[str, object]]:
    try:
        async with ws_connect(subres, path):
            pass
    except websockets.InvalidStatus as exc:
        body = exc.response.body or b"{}"
        return exc.response.status_code, json.loads(body)
    raise AssertionError(f"{path} upgraded")


@pytest.mark.parametrize(
    ("path", "code", "words"),
    [
        ("portforward/2", 403, "does not allow forwarding to tcp port 2"),
        ("portforward/2/udp", 403, "udp port 2"),
        ("portforward/0", 400, "invalid port"),
        ("portforward/70000", 400, "invalid port"),
        ("portforward/ssh", 400, "invalid port"),
        ("portforward/22/sctp", 400, "unsupported protocol"),
        (f"portforward/{DEAD_PORT}", 503, "cannot connect"),
    ],
)
async def test_refusals_are_status_objects(
    subres: Standalone, path: str, code: int, words: str
) -> None:
    status, body = await _status(subres, path)
    assert status == code
    assert body["kind"] == "Status" and body["code"] == code
    assert words in str(body["message"])


async def test_not_running_is_409_and_missing_404(subres: Standalone, echo: Backend) -> None:
    port = port_of(echo.url)
    for name, code in (("stopped", 409), ("nosuch", 404)):
        try:
            async with connect(
                subres.url(name, f"portforward/{port}"),
                ssl=subres.client_ssl,
                additional_headers=subres.auth,
            ):
                pass
        except websockets.InvalidStatus as exc:
            assert exc.response.status_code == code
        else:
            raise AssertionError("upgraded")
    assert echo.accepted == 0


async def test_plain_get_without_upgrade_is_400(subres: Standalone, echo: Backend) -> None:
    url = subres.url("vm1", f"portforward/{port_of(echo.url)}", scheme="https")
    async with (
        aiohttp.ClientSession() as http,
        http.get(url, ssl=subres.client_ssl, headers=subres.auth) as response,
    ):
        assert response.status == 400
        assert (await response.json())["kind"] == "Status"


async def test_backend_reset_mid_transfer_ends_the_session(tmp_path: Path) -> None:
    async def reset_after_some(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(100_000)
        writer.write(b"x" * 50_000)
        await writer.drain()
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        writer.transport.abort()

    backend = await Backend(handler=reset_after_some).start_tcp()
    try:
        port = port_of(backend.url)
        async with (
            start_standalone(tmp_path, pf_machine("vm1", [port])) as subres,
            ws_connect(subres, f"portforward/{port}") as ws,
        ):
            sender = asyncio.create_task(_send_all(ws, 1 << 20))
            got = 0
            with pytest.raises(websockets.ConnectionClosed):
                async with asyncio.timeout(10):
                    while True:
                        got += len(await ws.recv())
            sender.cancel()
            await asyncio.wait([sender])
            assert got <= 50_000
            await backend.wait_open(0)
            assert subres.server.state.sessions.live == set()
    finally:
        await backend.stop()
