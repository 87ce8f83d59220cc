"""The vnc subresource against real clients: raw bytes, takeover, preserveSession, refusals."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import websockets
from websockets.asyncio.client import connect

from tests.support import Backend, Standalone, machine, open_fds, start_standalone, wait_for

RAW_SUBPROTOCOLS: list[str | None] = ["plain.kubevirt.io", "binary", None]


def vnc_machine(name: str, endpoint: str | None, *, phase: str = "Running") -> dict[str, Any]:
    """A Machine whose display is at `endpoint`."""
    obj = machine(name, phase=phase)
    if endpoint is not None:
        obj["status"]["vnc"] = {"endpoint": endpoint}
    return obj


@pytest.fixture
async def subres(tmp_path: Path, backend: Backend) -> AsyncIterator[Standalone]:
    async with start_standalone(
        tmp_path,
        vnc_machine("vm1", backend.url),
        vnc_machine("stopped", backend.url, phase="Stopped"),
        vnc_machine("headless", None),
        vnc_machine("dead", "tcp://127.0.0.1:1"),
        vnc_machine("metadata", "tcp://169.254.169.254:5900"),
    ) as s:
        yield s


def ws_connect(subres: Standalone, name: str, *protocols: str, query: str = "") -> connect:
    return subres.websocket(subres.url(name, "vnc") + query, *protocols)


async def refused(
    subres: Standalone, name: str, *, protocols: list[str] | None = None, query: str = ""
) -> tuple[int, dict[str, Any]]:
    with pytest.raises(websockets.InvalidStatus) as info:
        async with ws_connect(subres, name, *(protocols or []), query=query):
            pass
    response = info.value.response
    return response.status_code, json.loads(response.body or b"{}")


@pytest.mark.parametrize("subprotocol", RAW_SUBPROTOCOLS)
async def test_bytes_arrive_intact_with_websockets(
    subres: Standalone, backend: Backend, subprotocol: str | None
) -> None:
    payload = os.urandom(3 << 20)
    async with ws_connect(subres, "vm1", *([subprotocol] if subprotocol else [])) as ws:
        assert ws.subprotocol == subprotocol

        async def send() -> None:
            for i in range(0, len(payload), 40_000):
                await ws.send(payload[i : i + 40_000])

        sender = asyncio.create_task(send())
        echoed = bytearray()
        async with asyncio.timeout(10):
            while len(echoed) < len(payload):
                message = await ws.recv()
                assert isinstance(message, bytes)
                echoed += message
        await sender
    assert hashlib.sha256(echoed).digest() == hashlib.sha256(payload).digest()
    await backend.wait_open(0)


@pytest.mark.parametrize("subprotocol", RAW_SUBPROTOCOLS)
async def test_bytes_arrive_intact_with_aiohttp(
    subres: Standalone, backend: Backend, subprotocol: str | None
) -> None:
    payload = os.urandom(1 << 20)
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(
            subres.url("vm1", "vnc"),
            ssl=subres.client_ssl,
            headers=subres.auth,
            protocols=(subprotocol,) if subprotocol else (),
            compress=0,
            max_msg_size=0,
        ) as ws,
    ):
        assert ws.protocol == subprotocol
        for i in range(0, len(payload), 256 << 10):
            await ws.send_bytes(payload[i : i + (256 << 10)])
        echoed = bytearray()
        while len(echoed) < len(payload):
            echoed += await ws.receive_bytes(timeout=10)
    assert hashlib.sha256(echoed).digest() == hashlib.sha256(payload).digest()
    await backend.wait_open(0)


async def test_second_session_takes_over(subres: Standalone, backend: Backend) -> None:
    async with ws_connect(subres, "vm1", "plain.kubevirt.io") as first:
        await first.send(b"one")
        assert await first.recv() == b"one"
        async with ws_connect(subres, "vm1", "binary") as second:
            with pytest.raises(websockets.ConnectionClosed):
                async with asyncio.timeout(5):
                    await first.recv()
            assert first.close_code == 4001
            assert "vnc of default/vm1 taken over" in (first.close_reason or "")
            await second.send(b"two")
            assert await second.recv() == b"two"
            await backend.wait_open(1)


async def test_preserve_session_is_refused_while_one_is_live(
    subres: Standalone, backend: Backend
) -> None:
    async with ws_connect(subres, "vm1") as first:
        await first.send(b"one")
        assert await first.recv() == b"one"
        status, body = await refused(subres, "vm1", query="?preserveSession=true")
        assert (status, body["code"], body["kind"]) == (409, 409, "Status")
        assert "already has a vnc session" in body["message"]
        assert backend.accepted == 1  # refused before dialing
        await first.send(b"still mine")
        assert await first.recv() == b"still mine"
    await wait_for(lambda: not subres.server.state.sessions.exclusive)
    async with ws_connect(subres, "vm1", query="?preserveSession=true") as ws:
        await ws.send(b"free now")
        assert await ws.recv() == b"free now"


@pytest.mark.parametrize(
    ("name", "code", "words"),
    [
        ("nosuch", 404, 'machines.subres.dev "nosuch" not found'),
        ("stopped", 409, '"Stopped"'),
        ("headless", 400, "has no vnc"),
        ("dead", 503, "cannot connect to tcp://127.0.0.1:1"),
        ("metadata", 403, "169.254.169.254 is not allowed"),
    ],
)
async def test_machine_errors(
    subres: Standalone, backend: Backend, name: str, code: int, words: str
) -> None:
    status, body = await refused(subres, name)
    assert status == code
    assert body["kind"] == "Status" and body["code"] == code and body["status"] == "Failure"
    assert words in body["message"]
    assert backend.accepted == 0


async def test_channel_subprotocols_are_not_offered_for_vnc(
    subres: Standalone, backend: Backend
) -> None:
    status, body = await refused(subres, "vm1", protocols=["v4.channel.k8s.io"])
    assert status == 400
    assert "plain.kubevirt.io, binary" in body["message"]
    assert backend.accepted == 0


async def test_plain_get_is_400(subres: Standalone, backend: Backend) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.get(
            subres.url("vm1", "vnc", scheme="https"), ssl=subres.client_ssl, headers=subres.auth
        ) as r,
    ):
        assert r.status == 400
        assert "needs a WebSocket upgrade" in (await r.json())["message"]
    assert backend.accepted == 0


async def test_sessions_leave_nothing_behind(subres: Standalone, backend: Backend) -> None:
    tasks, fds = len(asyncio.all_tasks()), open_fds()
    for i in range(10):
        async with ws_connect(subres, "vm1", "plain.kubevirt.io") as ws:
            await ws.send(b"x" * i + b"!")
            assert await ws.recv() == b"x" * i + b"!"
        status, _ = await refused(subres, "dead")
        assert status == 503
    await backend.wait_open(0)
    await wait_for(lambda: len(subres.server.state.sessions) == 0)
    await wait_for(lambda: len(asyncio.all_tasks()) <= tasks and open_fds() <= fds)
