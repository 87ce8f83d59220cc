"""Kubernetes-style `…/portforward?ports=…` over channel WebSockets, against real clients."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import struct
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import websockets
from websockets.asyncio.client import ClientConnection, connect

from tests.server.portforward_support import (
    BULK_SIZE,
    chunks,
    digest,
    pf_machine,
    port_of,
)
from tests.support import Backend, Standalone, start_standalone

DEAD_PORT = 1


@pytest.fixture
async def subres(tmp_path: Path, echo: Backend, summer: Backend) -> AsyncIterator[Standalone]:
    ports = [port_of(echo.url), port_of(summer.url), DEAD_PORT]
    async with start_standalone(tmp_path, pf_machine("vm1", ports)) as s:
        yield s


def query(*ports: int | str) -> str:
    return "portforward?ports=" + ",".join(map(str, ports))


def ws_connect(subres: Standalone, path: str, *protocols: str) -> connect:
    return subres.websocket(subres.url("vm1", path), *protocols)


def prefix(channel: int, port: int) -> bytes:
    return bytes([channel]) + struct.pack("<H", port)


async def recv_hello(ws: ClientConnection, ports: list[int]) -> None:
    expected = [prefix(c, p) for i, p in enumerate(ports) for c in (2 * i, 2 * i + 1)]
    got = [await asyncio.wait_for(ws.recv(), 5) for _ in expected]
    assert got == expected


@pytest.mark.parametrize("protocols", [("v4.channel.k8s.io",), ()], ids=["v4", "none"])
async def test_hello_names_each_port_on_data_and_error_channels(
    subres: Standalone, echo: Backend, summer: Backend, protocols: tuple[str, ...]
) -> None:
    ports = [port_of(echo.url), port_of(summer.url)]
    async with ws_connect(subres, query(*ports), *protocols) as ws:
        assert ws.subprotocol == (protocols[0] if protocols else None)
        await recv_hello(ws, ports)


async def test_v5_offer_falls_back_to_v4(subres: Standalone, echo: Backend) -> None:
    async with ws_connect(
        subres, query(port_of(echo.url)), "v5.channel.k8s.io", "v4.channel.k8s.io"
    ) as ws:
        assert ws.subprotocol == "v4.channel.k8s.io"


async def test_bulk_on_one_port_hashed(subres: Standalone, echo: Backend) -> None:
    port = port_of(echo.url)
    started = time.monotonic()
    async with ws_connect(subres, query(port), "v4.channel.k8s.io") as ws:
        await recv_hello(ws, [port])

        async def send() -> None:
            for chunk in chunks(BULK_SIZE):
                await ws.send(b"\x00" + chunk)

        sender = asyncio.create_task(send())
        h = hashlib.sha256()
        got = 0
        async with asyncio.timeout(120):
            while got < BULK_SIZE:
                message = await ws.recv()
                assert isinstance(message, bytes) and message[0] == 0
                h.update(message[1:])
                got += len(message) - 1
            await sender
    elapsed = time.monotonic() - started
    rate = BULK_SIZE / elapsed / 1e6
    print(f"k8s v4 websockets {BULK_SIZE >> 20} MiB each way: {rate:.0f} MB/s")
    assert h.hexdigest() == digest(BULK_SIZE)


async def test_several_ports_and_a_repeated_one_on_one_websocket(
    subres: Standalone, echo: Backend, summer: Backend
) -> None:
    ports = [port_of(echo.url), port_of(echo.url), port_of(summer.url)]
    path = f"portforward?ports={ports[0]}&ports={ports[1]},{ports[2]}"
    async with ws_connect(subres, path, "v4.channel.k8s.io") as ws:
        await recv_hello(ws, ports)
        await echo.wait_open(2)
        payloads = [b"".join(chunks(300_000, seed=i)) for i in range(3)]
        for i, payload in enumerate(payloads):
            for j in range(0, len(payload), 50_000):
                await ws.send(bytes([2 * i]) + payload[j : j + 50_000])
        got: dict[int, bytes] = {0: b"", 2: b""}
        async with asyncio.timeout(10):
            while len(got[0]) < 300_000 or len(got[2]) < 300_000:
                message = await ws.recv()
                assert isinstance(message, bytes)
                got[message[0]] += message[1:]
    assert got == {0: payloads[0], 2: payloads[1]}
    # The summing backend never saw EOF: v4 cannot half-close a port.
    assert summer.accepted == 1


async def test_base64_with_aiohttp(subres: Standalone, echo: Backend) -> None:
    port = port_of(echo.url)
    lo_hi = base64.b64encode(struct.pack("<H", port)).decode()
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(
            subres.url("vm1", query(port)),
            ssl=subres.client_ssl,
            headers=subres.auth,
            protocols=("v4.base64.channel.k8s.io",),
            compress=0,
        ) as ws,
    ):
        assert ws.protocol == "v4.base64.channel.k8s.io"
        assert [await ws.receive_str(timeout=5) for _ in range(2)] == ["0" + lo_hi, "1" + lo_hi]
        payload = bytes(range(256)) * 100
        await ws.send_str("0" + base64.b64encode(payload).decode())
        got = b""
        while len(got) < len(payload):
            message = await ws.receive_str(timeout=5)
            assert message[0] == "0"
            got += base64.b64decode(message[1:])
        assert got == payload


async def test_aiohttp_binary_bulk(subres: Standalone, echo: Backend) -> None:
    port = port_of(echo.url)
    size = 8 << 20
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(
            subres.url("vm1", query(port)),
            ssl=subres.client_ssl,
            headers=subres.auth,
            protocols=("v4.channel.k8s.io",),
            compress=0,
        ) as ws,
    ):
        assert [await ws.receive_bytes(timeout=5) for _ in range(2)] == [
            prefix(0, port),
            prefix(1, port),
        ]

        async def send() -> None:
            for chunk in chunks(size):
                await ws.send_bytes(b"\x00" + chunk)

        sender = asyncio.create_task(send())
        h = hashlib.sha256()
        got = 0
        async with asyncio.timeout(30):
            while got < size:
                message = await ws.receive_bytes()
                h.update(message[1:])
                got += len(message) - 1
            await sender
    assert h.hexdigest() == digest(size)


async def test_dial_failure_goes_to_that_ports_error_channel(
    subres: Standalone, echo: Backend
) -> None:
    port = port_of(echo.url)
    async with ws_connect(subres, query(DEAD_PORT, port), "v4.channel.k8s.io") as ws:
        await recv_hello(ws, [DEAD_PORT, port])
        error = await asyncio.wait_for(ws.recv(), 5)
        assert isinstance(error, bytes) and error[0] == 1
        assert error[1:].startswith(b"error forwarding port 1: Machine default/vm1:")
        await ws.send(b"\x02still works")
        assert await asyncio.wait_for(ws.recv(), 5) == b"\x02still works"


async def test_backend_end_closes_the_websocket_1000(tmp_path: Path) -> None:
    async def greet(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"bye")
        await writer.drain()

    backend = await Backend(handler=greet).start_tcp()
    try:
        port = port_of(backend.url)
        async with (
            start_standalone(tmp_path, pf_machine("vm1", [port])) as subres,
            ws_connect(subres, query(port), "v4.channel.k8s.io") as ws,
        ):
            await recv_hello(ws, [port])
            assert await asyncio.wait_for(ws.recv(), 5) == b"\x00bye"
            with pytest.raises(websockets.ConnectionClosedOK):
                await asyncio.wait_for(ws.recv(), 5)
            assert ws.close_code == 1000
            await backend.wait_open(0)
    finally:
        await backend.stop()


async def test_client_close_delivers_what_was_sent_then_eof(
    subres: Standalone, summer: Backend
) -> None:
    port = port_of(summer.url)
    payload = b"".join(chunks(1 << 20, seed=3))
    async with ws_connect(subres, query(port), "v4.channel.k8s.io") as ws:
        await recv_hello(ws, [port])
        for i in range(0, len(payload), 1 << 16):
            await ws.send(b"\x00" + payload[i : i + (1 << 16)])
    await summer.wait_open(0)
    assert summer.accepted == 1


async def _refusal(subres: Standalone, path: str) -> tuple[int, dict[str, object]]:
    try:
        async with ws_connect(subres, path, "v4.channel.k8s.io"):
            pass
    except websockets.InvalidStatus as exc:
        return exc.response.status_code, json.loads(exc.response.body or b"{}")
    raise AssertionError(f"{path} upgraded")


@pytest.mark.parametrize(
    ("path", "code", "words"),
    [
        ("portforward", 400, '"ports" is required'),
        ("portforward?ports=", 400, "cannot be empty"),
        ("portforward?ports=ssh", 400, "unable to parse"),
        ("portforward?ports=22,,80", 400, "unable to parse"),
        ("portforward?ports=-1", 400, "unable to parse"),
        ("portforward?ports=0", 400, "must be > 0"),
        ("portforward?ports=65536", 400, "out of range"),
        ("portforward?ports=2", 403, "does not allow forwarding to tcp port 2"),
    ],
)
async def test_refusals_before_upgrade(
    subres: Standalone, echo: Backend, path: str, code: int, words: str
) -> None:
    status, body = await _refusal(subres, path)
    assert (status, body["code"], body["kind"]) == (code, code, "Status")
    assert words in str(body["message"])
    assert echo.accepted == 0


async def test_unsupported_subprotocol_is_400(subres: Standalone, echo: Backend) -> None:
    try:
        async with ws_connect(subres, query(port_of(echo.url)), "v5.channel.k8s.io"):
            pass
    except websockets.InvalidStatus as exc:
        assert exc.response.status_code == 400
    else:
        raise AssertionError("upgraded")
