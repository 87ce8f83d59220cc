"""Raw uploads are batched from aiohttp's queue: pin the private detail it relies on."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from subres.streams.websocket import binary_queued, take_queued
from tests.support import wait_for


async def test_queued_binary_messages_are_taken_as_one_chunk() -> None:
    taken: asyncio.Future[tuple[bytes, bool]] = asyncio.get_running_loop().create_future()

    async def handler(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        first = await ws.receive_bytes()
        # If aiohttp's queue changes shape, this never holds and the test fails:
        # batching would silently be gone otherwise.
        await wait_for(lambda: binary_queued(ws))
        await wait_for(lambda: len(ws._reader._buffer) >= 2)  # type: ignore[union-attr]
        taken.set_result(await take_queued(ws, first))
        await ws.close()
        return ws

    app = web.Application()
    app.router.add_get("/", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with (
            aiohttp.ClientSession() as http,
            http.ws_connect(f"http://127.0.0.1:{port}/") as ws,
        ):
            for part in (b"one ", b"two ", b"three"):
                await ws.send_bytes(part)
            async with asyncio.timeout(5):
                chunk, ended = await taken
    finally:
        await runner.cleanup()
    assert (chunk, ended) == (b"one two three", False)
