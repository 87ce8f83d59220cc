"""The one upgrade client (`subres.engine.client`) and the WebSockets it opens, against
servers written here on 127.0.0.1 that answer with fixed bytes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from subres.engine import client, wsclient
from subres.engine.client import Peer, UpgradedStream, UpgradeRefused

TIMEOUT = 10.0
STATUS = b'{"kind":"Status","code":404,"message":"machines.subres.dev \\"vm9\\" not found"}'


@contextlib.asynccontextmanager
async def answering(answer: bytes, *, then: bytes = b"") -> AsyncIterator[tuple[int, list[bytes]]]:
    """A server that reads one request head, sends `answer` (and `then`), and echoes."""
    heads: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            heads.append(await reader.readuntil(b"\r\n\r\n"))
            writer.write(answer + then)
            while data := await reader.read(65536):
                writer.write(data)
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], heads
    finally:
        server.close()
        await server.wait_closed()


async def test_a_refusal_keeps_its_status_body() -> None:
    answer = (
        b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(STATUS), STATUS)
    )
    async with answering(answer) as (port, _), asyncio.timeout(TIMEOUT):
        with pytest.raises(UpgradeRefused) as info:
            await client.upgrade(
                Peer(f"http://127.0.0.1:{port}/x"),
                method="POST",
                headers={"Connection": "Upgrade", "Upgrade": "SPDY/3.1"},
                stream=UpgradedStream,
            )
    assert (info.value.status, info.value.body) == (404, STATUS)


async def test_bytes_after_the_101_are_the_new_protocol_s() -> None:
    answer = b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: x\r\n\r\n"
    async with answering(answer, then=b"first") as (port, heads), asyncio.timeout(TIMEOUT):
        conn = await client.upgrade(
            Peer(f"http://127.0.0.1:{port}/path?q=1", headers={"Authorization": "Bearer t"}),
            method="POST",
            headers={"Connection": "Upgrade", "Upgrade": "x"},
            stream=UpgradedStream,
        )
        assert await conn.read() == b"first"
        await conn.write(b"echoed")
        assert await conn.read() == b"echoed"
        await conn.close()
    head = heads[0].decode()
    assert head.startswith("POST /path?q=1 HTTP/1.1\r\n")
    assert f"host: 127.0.0.1:{port}" in head.lower() and "Authorization: Bearer t" in head


async def test_an_answer_that_is_not_http_is_a_connection_error() -> None:
    async with answering(b"SSH-2.0-OpenSSH_9.2\r\n\r\n") as (port, _), asyncio.timeout(TIMEOUT):
        with pytest.raises(ConnectionError, match="not HTTP"):
            await client.upgrade(
                Peer(f"http://127.0.0.1:{port}/"), method="GET", headers={}, stream=UpgradedStream
            )


async def test_a_websocket_with_a_wrong_accept_is_refused() -> None:
    answer = (
        b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
        b"Sec-WebSocket-Accept: d3Jvbmc=\r\n\r\n"
    )
    async with answering(answer) as (port, _), asyncio.timeout(TIMEOUT):
        with pytest.raises(ConnectionError, match="Sec-WebSocket-Accept"):
            await wsclient.connect(
                Peer(f"http://127.0.0.1:{port}/"), max_size=1 << 20, close_timeout=1.0
            )


async def test_a_websocket_subprotocol_not_offered_is_refused() -> None:
    accepted: list[str] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        key = next(
            line.split(":", 1)[1].strip()
            for line in head.split("\r\n")
            if line.lower().startswith("sec-websocket-key:")
        )
        accepted.append(key)
        writer.write(
            b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
            + f"Sec-WebSocket-Accept: {client.websocket_accept(key)}\r\n".encode()
            + b"Sec-WebSocket-Protocol: other\r\n\r\n"
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with asyncio.timeout(TIMEOUT):
            with pytest.raises(ConnectionError, match="'other'"):
                await wsclient.connect(
                    Peer(f"http://127.0.0.1:{port}/"),
                    subprotocols=["SPDY/3.1+portforward.k8s.io"],
                    max_size=1 << 20,
                    close_timeout=1.0,
                )
    finally:
        server.close()
        await server.wait_closed()
    assert accepted


async def test_a_proxy_that_refuses_the_tunnel_is_a_connection_error() -> None:
    refusal = b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n"
    async with answering(refusal) as (proxy, heads), asyncio.timeout(TIMEOUT):
        with pytest.raises(ConnectionError, match="refused the tunnel: 403"):
            await client.upgrade(
                Peer("http://127.0.0.1:9/", proxy=f"http://127.0.0.1:{proxy}"),
                method="GET",
                headers={},
                stream=UpgradedStream,
            )
    # The proxy was asked for the server and refused: nothing but the proxy was dialled.
    assert heads[0].startswith(b"CONNECT 127.0.0.1:9 HTTP/1.1\r\n")
