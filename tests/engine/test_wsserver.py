"""The server's WebSocket over a real socket, with and without TLS, on the loop under test.

Bytes a client sends in any framing and chunking (some before the 101 is
even read, several connections at once sharing the read buffer) reach the
handler intact; pings are answered, a close is answered with the client's
code, hostile frames get their close code, and a reader that stops reading
stops the socket.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import random
import ssl
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import web

from subres.engine.wsserver import HIGH_WATER, ServerWebSocket, WebSocketUpgrade
from subres.protocol.websocket import Opcode
from subres.serving import certs
from tests.wsframes import client_frame, read_frame

Handler = Callable[[ServerWebSocket], Awaitable[None]]


@asynccontextmanager
async def serving(
    handler: Handler, tmp_path: Path, *, tls: bool, prefix: bool = False
) -> AsyncIterator[Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]]:
    """An aiohttp server whose one route hands the WebSocket to `handler`; yields a dialer."""

    async def route(request: web.Request) -> web.StreamResponse:
        upgrade = WebSocketUpgrade(
            subprotocol="", max_message=1 << 20, ping_interval=None, prefix=prefix
        )
        response, ws = await upgrade.accept(request)
        await handler(ws)
        return response

    app = web.Application()
    app.router.add_get("/", route)
    runner = web.AppRunner(app)
    await runner.setup()
    server_ssl = client_ssl = None
    if tls:
        ca = certs.generate_ca("test-ca")
        leaf = certs.issue_serving(ca, common_name="x", dns_names=[], ip_addresses=["127.0.0.1"])
        leaf.write(tmp_path / "tls.crt", tmp_path / "tls.key")
        server_ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ssl.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
        client_ssl = ssl.create_default_context(cadata=ca.cert_pem().decode())
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ssl)
    await site.start()
    port = runner.addresses[0][1]

    async def dial() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", port, ssl=client_ssl)

    try:
        yield dial
    finally:
        await runner.cleanup()


def request_head() -> bytes:
    key = base64.b64encode(os.urandom(16)).decode()
    return (
        "GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    ).encode()


async def drain_input(ws: ServerWebSocket) -> None:
    """Read until the input ends."""
    while await ws.receive() is not None:
        pass


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
async def test_bytes_in_any_framing_arrive_intact_on_concurrent_connections(
    tmp_path: Path, tls: bool
) -> None:
    async def client(
        dial: Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]], seed: int
    ) -> None:
        rng = random.Random(seed)
        reader, writer = await dial()
        payload = rng.randbytes(700_000)
        wire = b""
        pos = 0
        while pos < len(payload):
            size = rng.choice([0, 1, 125, 126, 4000, 65535, 65536, 200_000])
            wire += client_frame(Opcode.BINARY, payload[pos : pos + size])
            pos += size
        # The first frames go with the request, before the 101 is read.
        writer.write(request_head() + wire[:1000])
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101")
        cut = 1000
        while cut < len(wire):
            step = rng.randint(1, 100_000)
            writer.write(wire[cut : cut + step])
            await writer.drain()
            cut += step
        writer.write(client_frame(Opcode.CLOSE, b"\x03\xe8"))
        # The server hashes what it read until our close: nothing is answered after it.
        opcode, close = await read_frame(reader)
        assert (opcode, close) == (Opcode.CLOSE, b"\x03\xe8")
        writer.close()

    received: list[bytes] = []

    async def hasher(ws: ServerWebSocket) -> None:
        digest = hashlib.sha256()
        while (piece := await ws.receive()) is not None:
            digest.update(piece.data)
        received.append(digest.digest())

    async with serving(hasher, tmp_path, tls=tls) as dial, asyncio.timeout(60):
        await asyncio.gather(*(client(dial, seed) for seed in range(3)))
    expected = {
        hashlib.sha256(random.Random(seed).randbytes(700_000)).digest() for seed in range(3)
    }
    assert set(received) == expected


async def test_pings_are_answered_and_prefixed_channels_taken_apart(tmp_path: Path) -> None:
    pieces: list[tuple[int, bytes, bool]] = []

    async def record(ws: ServerWebSocket) -> None:
        while (piece := await ws.receive()) is not None:
            pieces.append((piece.channel, piece.data, piece.last))

    async with serving(record, tmp_path, tls=False, prefix=True) as dial:
        reader, writer = await dial()
        writer.write(request_head())
        await reader.readuntil(b"\r\n\r\n")
        writer.write(client_frame(Opcode.PING, b"are you there"))
        assert await read_frame(reader) == (Opcode.PONG, b"are you there")
        message = b"\x07" + os.urandom(3000)
        # One message in three fragments: the channel byte comes only with the first.
        writer.write(
            client_frame(Opcode.BINARY, message[:1], fin=False)
            + client_frame(Opcode.CONTINUATION, message[1:2000], fin=False)
            + client_frame(Opcode.CONTINUATION, message[2000:])
            + client_frame(Opcode.CLOSE, struct.pack("!H", 4000))
        )
        # The close is echoed with the client's code.
        assert await read_frame(reader) == (Opcode.CLOSE, struct.pack("!H", 4000))
        writer.close()
    assert {channel for channel, _, _ in pieces} == {7}
    assert b"".join(data for _, data, _ in pieces) == message[1:] and pieces[-1][2]


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        (client_frame(Opcode.BINARY, b"x", masked=False), 1002),
        (client_frame(Opcode.TEXT, b"\xc3\x28"), 1007),
        (client_frame(Opcode.BINARY, b"", length=2 << 20), 1009),
        (client_frame(Opcode.CLOSE, b"\x03"), 1002),
    ],
    ids=["unmasked", "bad-utf8", "too-big", "short-close"],
)
async def test_hostile_frames_get_their_close_code_and_the_hang_up(
    tmp_path: Path, frame: bytes, code: int
) -> None:
    async with serving(drain_input, tmp_path, tls=False) as dial:
        reader, writer = await dial()
        writer.write(request_head())
        await reader.readuntil(b"\r\n\r\n")
        writer.write(frame)
        async with asyncio.timeout(5):
            opcode, payload = await read_frame(reader)
            assert opcode == Opcode.CLOSE and struct.unpack("!H", payload[:2])[0] == code
            assert await reader.read() == b""  # and the server hangs up
        writer.close()


async def test_a_handler_that_stops_reading_stops_the_socket(tmp_path: Path) -> None:
    started = asyncio.Event()
    release = asyncio.Event()

    async def stalled(ws: ServerWebSocket) -> None:
        started.set()
        await release.wait()
        await drain_input(ws)

    async with serving(stalled, tmp_path, tls=False) as dial:
        reader, writer = await dial()
        writer.write(request_head())
        await reader.readuntil(b"\r\n\r\n")
        await started.wait()
        chunk = client_frame(Opcode.BINARY, b"z" * 65536)
        sent = 0
        with pytest.raises(TimeoutError):
            while True:
                writer.write(chunk)
                async with asyncio.timeout(1):
                    await writer.drain()
                sent += 65536
        # The server took at most its high-water mark plus the kernel's buffers.
        assert sent < HIGH_WATER + (16 << 20)
        release.set()
        writer.write(client_frame(Opcode.CLOSE, b""))
        async with asyncio.timeout(10):
            while (await read_frame(reader))[0] != Opcode.CLOSE:
                pass
        writer.close()
