"""The console subresource against real clients: websockets and aiohttp, every dialect."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import websockets
from websockets.asyncio.client import ClientConnection, connect

from tests.support import Backend, Standalone, machine, start_standalone

CHANNEL_DIALECTS: list[str | None] = ["v5.channel.k8s.io", "v4.channel.k8s.io", "channel.k8s.io"]
BASE64_DIALECTS: list[str | None] = ["v4.base64.channel.k8s.io", "base64.channel.k8s.io"]
RAW_DIALECTS: list[str | None] = ["plain.kubevirt.io", None]


@pytest.fixture
async def subres(tmp_path: Path, backend: Backend) -> AsyncIterator[Standalone]:
    async with start_standalone(
        tmp_path,
        machine("vm1", console=backend.url),
        machine("stopped", console=backend.url, phase="Stopped"),
        machine("headless"),
        machine("dead", console="tcp://127.0.0.1:1"),
    ) as s:
        yield s


def ws_connect(subres: Standalone, name: str, *protocols: str) -> connect:
    return subres.websocket(subres.url(name), *protocols)


def frame(dialect: str | None, channel: int, data: bytes) -> bytes | str:
    if dialect in CHANNEL_DIALECTS:
        return bytes([channel]) + data
    if dialect in BASE64_DIALECTS:
        return chr(ord("0") + channel) + base64.b64encode(data).decode()
    return data


def unframe(dialect: str | None, message: bytes | str) -> tuple[int, bytes]:
    if dialect in CHANNEL_DIALECTS:
        assert isinstance(message, bytes)
        return message[0], message[1:]
    if dialect in BASE64_DIALECTS:
        assert isinstance(message, str)
        return ord(message[0]) - ord("0"), base64.b64decode(message[1:])
    assert isinstance(message, bytes)
    return 1, message


async def read_stdout(ws: ClientConnection, dialect: str | None, size: int) -> bytes:
    got = bytearray()
    async with asyncio.timeout(10):
        while len(got) < size:
            channel, data = unframe(dialect, await ws.recv())
            if channel == 1:
                got += data
    return bytes(got)


@pytest.mark.parametrize("dialect", CHANNEL_DIALECTS + BASE64_DIALECTS + RAW_DIALECTS)
async def test_bytes_arrive_intact_in_every_dialect(
    subres: Standalone, backend: Backend, dialect: str | None
) -> None:
    payload = os.urandom(3 << 20)
    async with ws_connect(subres, "vm1", *([dialect] if dialect else [])) as ws:
        assert ws.subprotocol == dialect
        chunks = [payload[i : i + 50_000] for i in range(0, len(payload), 50_000)]

        async def send() -> None:
            for chunk in chunks:
                await ws.send(frame(dialect, 0, chunk))

        sender = asyncio.create_task(send())
        echoed = await read_stdout(ws, dialect, len(payload))
        await sender
    assert hashlib.sha256(echoed).digest() == hashlib.sha256(payload).digest()
    await backend.wait_open(0)


@pytest.mark.parametrize("dialect", CHANNEL_DIALECTS + BASE64_DIALECTS)
async def test_channel_dialects_say_hello_on_stdout(subres: Standalone, dialect: str) -> None:
    async with ws_connect(subres, "vm1", dialect) as ws:
        channel, data = unframe(dialect, await asyncio.wait_for(ws.recv(), 5))
        assert (channel, data) == (1, b"")


@pytest.mark.parametrize("dialect", CHANNEL_DIALECTS + BASE64_DIALECTS + RAW_DIALECTS)
async def test_aiohttp_client_in_every_dialect(subres: Standalone, dialect: str | None) -> None:
    payload = os.urandom(300_000)
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(
            subres.url("vm1"),
            ssl=subres.client_ssl,
            headers=subres.auth,
            protocols=(dialect,) if dialect else (),
            compress=0,
            max_msg_size=0,
        ) as ws,
    ):
        assert ws.protocol == dialect
        message = frame(dialect, 0, payload)
        if isinstance(message, str):
            await ws.send_str(message)
        else:
            await ws.send_bytes(message)
        echoed = bytearray()
        async with asyncio.timeout(10):
            while len(echoed) < len(payload):
                received = await ws.receive()
                channel, data = unframe(dialect, received.data)
                if channel == 1:
                    echoed += data
    assert hashlib.sha256(echoed).digest() == hashlib.sha256(payload).digest()


async def test_backend_close_ends_session_with_success_status(
    tmp_path: Path,
) -> None:
    async def greet_and_close(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"bye")
        await writer.drain()

    backend = await Backend(handler=greet_and_close).start_tcp()
    try:
        async with (
            start_standalone(tmp_path, machine("vm1", console=backend.url)) as subres,
            ws_connect(subres, "vm1", "v5.channel.k8s.io") as ws,
        ):
            messages = [m async for m in _until_closed(ws)]
            assert messages[0] == b"\x01"
            assert b"\x01bye" in messages
            status = json.loads(messages[-1][1:])
            assert messages[-1][0] == 3 and status["status"] == "Success"
            assert ws.close_code == 1000
            assert "backend closed" in (ws.close_reason or "")
    finally:
        await backend.stop()


async def _until_closed(ws: ClientConnection) -> AsyncIterator[bytes]:
    async with asyncio.timeout(5):
        try:
            while True:
                message = await ws.recv()
                assert isinstance(message, bytes)
                yield message
        except websockets.ConnectionClosedOK:
            return


async def test_v5_stdin_close_half_closes_the_backend(subres: Standalone) -> None:
    async with ws_connect(subres, "vm1", "v5.channel.k8s.io") as ws:
        await ws.recv()
        await ws.send(b"\x00last words")
        await ws.send(b"\xff\x00")
        # The echo backend answers, then closes after our EOF: the session ends by itself.
        messages = [m async for m in _until_closed(ws)]
    assert b"".join(m[1:] for m in messages if m[0] == 1) == b"last words"
    assert json.loads(messages[-1][1:])["status"] == "Success"


async def test_second_console_takes_over(subres: Standalone, backend: Backend) -> None:
    async with ws_connect(subres, "vm1") as first:
        await first.send(b"one")
        assert await first.recv() == b"one"
        async with ws_connect(subres, "vm1") as second:
            with pytest.raises(websockets.ConnectionClosed):
                async with asyncio.timeout(5):
                    await first.recv()
            assert first.close_code == 4001
            assert "taken over" in (first.close_reason or "")
            await second.send(b"two")
            assert await second.recv() == b"two"
            await backend.wait_open(1)


async def test_resize_messages_are_accepted(subres: Standalone) -> None:
    async with ws_connect(subres, "vm1", "v4.channel.k8s.io") as ws:
        await ws.recv()
        await ws.send(b'\x04{"Width":120,"Height":40}{"Width":80,"Height":24}')
        await ws.send(b"\x04not json")
        await ws.send(b"\x00still here")
        assert await read_stdout(ws, "v4.channel.k8s.io", 10) == b"still here"
