"""Drain on SIGTERM, proven on a real `subres serve` process.

Readiness fails at once; the server keeps serving through `--shutdown-delay`;
then it stops accepting, tells live sessions it is going away (1001), and
exits within `--shutdown-delay` plus `--shutdown-grace` whatever the sessions
do: a client that reads nothing, a backend that takes nothing, a SPDY peer
that never hangs up. Times are measured from the signal with the event
loop's clock; the bounds are the facts under test, not waits.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import re
import signal
from pathlib import Path
from typing import cast

import aiohttp

from tests.support import Backend, ServeProcess, machine, serve_process

MARGIN = 2.0
"""Seconds allowed past delay + grace for the interpreter to exit on a busy 2-core machine."""


async def wait_exit(server: ServeProcess, *, started: float, bound: float) -> tuple[int, float]:
    """The exit code and the seconds from `started` (loop time) to the exit."""
    async with asyncio.timeout(bound + 10):
        code = await server.proc.wait()
    return code, asyncio.get_running_loop().time() - started


async def firehose(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A backend that writes as fast as it is taken, forever."""
    block = os.urandom(64 << 10)
    while True:
        writer.write(block)
        await writer.drain()


async def black_hole(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A backend that takes nothing and says nothing, and never hangs up."""
    # uvloop's transports are only alike asyncio.Transport, not subclasses.
    transport = cast(asyncio.Transport, writer.transport)
    transport.pause_reading()
    await asyncio.Event().wait()


# Both tests start the real server the same way (`serve_process`); machines and timings differ.


async def test_sigterm_fails_readiness_serves_through_the_delay_then_says_going_away(
    tmp_path: Path, backend: Backend
) -> None:
    delay, grace = 3.0, 3.0
    loop = asyncio.get_running_loop()
    async with (
        serve_process(
            tmp_path,
            machine("vm1", console=backend.url),
            machine("vm2", console=backend.url),
            delay=delay,
            grace=grace,
        ) as server,
        aiohttp.ClientSession() as http,
    ):
        first = await http.ws_connect(server.console("vm1"), ssl=server.ssl(), headers=server.auth)
        await first.send_bytes(b"before")
        assert await first.receive_bytes(timeout=5) == b"before"

        started = loop.time()
        server.proc.send_signal(signal.SIGTERM)

        async def ready_status() -> tuple[int, str]:
            async with http.get(server.base + "/readyz", ssl=server.ssl()) as response:
                return response.status, await response.text()

        async with asyncio.timeout(delay):
            while (answer := await ready_status())[0] == 200:  # noqa: ASYNC110 - another process
                await asyncio.sleep(0.02)
        assert answer[0] == 500 and "[-]shutdown failed" in answer[1], answer
        async with http.get(server.base + "/livez", ssl=server.ssl()) as live:
            assert live.status == 200

        # Still serving: a new session opens and works during the delay.
        second = await http.ws_connect(server.console("vm2"), ssl=server.ssl(), headers=server.auth)
        await second.send_bytes(b"during")
        assert await second.receive_bytes(timeout=5) == b"during"
        assert loop.time() - started < delay, "the new session was not served within the delay"

        for ws in (first, second):
            closing = await ws.receive(timeout=delay + grace + MARGIN)
            assert closing.type == aiohttp.WSMsgType.CLOSE, closing
            assert (closing.data, closing.extra) == (1001, "the server is shutting down")
        closed_after = loop.time() - started
        assert closed_after >= delay, f"sessions ended {closed_after:.2f}s after SIGTERM"

        try:
            async with http.get(server.base + "/livez", ssl=server.ssl()) as late:
                raise AssertionError(f"still accepting after the delay: {late.status}")
        except aiohttp.ClientConnectorError:
            pass
        code, exited_after = await wait_exit(server, started=started, bound=delay + grace)
    assert code == 0, "".join(server.log)
    # Both sessions ended at once: no need to wait out the grace.
    assert exited_after <= delay + grace + MARGIN, exited_after
    await backend.wait_open(0)


async def test_stuck_sessions_do_not_hold_the_exit_back(tmp_path: Path, backend: Backend) -> None:
    delay, grace = 0.5, 2.0
    loop = asyncio.get_running_loop()
    hose = await Backend(handler=firehose).start_tcp()
    hole = await Backend(handler=black_hole).start_tcp()
    try:
        async with (
            serve_process(
                tmp_path,
                machine("hose", console=hose.url),
                machine("hole", console=hole.url),
                machine("spdy", console=backend.url),
                delay=delay,
                grace=grace,
            ) as server,
            aiohttp.ClientSession() as http,
        ):
            # A WebSocket client that never reads: the server's writes to it block.
            deaf = await _open_raw(server, _websocket_upgrade(server, "hose"))
            # A client whose backend takes nothing: the server's writes to the backend block.
            stuffed = await http.ws_connect(
                server.console("hole"), ssl=server.ssl(), headers=server.auth
            )
            stuffing = asyncio.create_task(_stuff(stuffed))
            # A SPDY peer that never speaks again and never hangs up.
            mute = await _open_raw(server, _spdy_upgrade(server, "spdy"))
            await _wait_sessions(http, server, 3)

            started = loop.time()
            server.proc.send_signal(signal.SIGTERM)
            code, exited_after = await wait_exit(server, started=started, bound=delay + grace)
            stuffing.cancel()
            await asyncio.wait([stuffing])
            for _, writer in (deaf, mute):
                writer.close()
            await stuffed.close()
    finally:
        await hose.stop()
        await hole.stop()
    assert code == 0, "".join(server.log)
    assert delay <= exited_after <= delay + grace + MARGIN, exited_after
    # The deaf client's session may end at once: its close frame is sent without waiting
    # to drain. The other two are still stuck when the grace ends.
    assert any(re.search(r"dropping [23] sessions", line) for line in server.log), "".join(
        server.log
    )
    # Each session's end is still recorded, with why.
    ended = [line for line in server.log if "ended by" in line]
    for name in ("hose", "hole", "spdy"):
        [line] = [line for line in ended if f"Machine default/{name} " in line]
        assert line.rstrip().endswith("the server is shutting down"), line


async def _stuff(ws: aiohttp.ClientWebSocketResponse) -> None:
    """Send 32 MiB, far more than the buffers on the way to a backend that reads nothing."""
    block = os.urandom(512 << 10)
    with contextlib.suppress(ConnectionError, aiohttp.ClientError):
        for _ in range(64):
            await ws.send_bytes(block)


async def _open_raw(
    server: ServeProcess, request: bytes
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A TLS connection that sent `request` and got its 101; then it is left alone."""
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", server.port, ssl=server.ssl(), server_hostname="localhost"
    )
    writer.write(request)
    async with asyncio.timeout(10):
        head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101"), head
    return reader, writer


def _websocket_upgrade(server: ServeProcess, name: str) -> bytes:
    return _request(
        server,
        name,
        "GET",
        Upgrade="websocket",
        **{"Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode()},
        **{"Sec-WebSocket-Version": "13"},
    )


def _spdy_upgrade(server: ServeProcess, name: str) -> bytes:
    return _request(
        server,
        name,
        "POST",
        Upgrade="SPDY/3.1",
        **{"X-Stream-Protocol-Version": "v4.channel.k8s.io"},
    )


def _request(server: ServeProcess, name: str, method: str, **headers: str) -> bytes:
    path = server.console(name).removeprefix(server.base)
    lines = [f"{method} {path} HTTP/1.1", "Host: localhost", "Connection: Upgrade"]
    lines += [f"Authorization: Bearer {server.token}", "Content-Length: 0"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def _wait_sessions(http: aiohttp.ClientSession, server: ServeProcess, count: int) -> None:
    """Until the server's metrics count `count` live sessions (nothing else signals it)."""

    async def live() -> float:
        async with http.get(server.base + "/metrics", ssl=server.ssl(), headers=server.auth) as r:
            text = await r.text()
        found = re.findall(r"^subres_sessions_active\{[^}]*\} (\S+)$", text, re.MULTILINE)
        return sum(float(v) for v in found)

    async with asyncio.timeout(10):
        while await live() < count:  # noqa: ASYNC110 - another process's count
            await asyncio.sleep(0.05)
