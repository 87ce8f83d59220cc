"""Every session ends when either side is gone, however blocked the other direction is.

A backend that takes nothing, a backend that resets, a client that vanishes
mid-upload: each ends its session with the right close code and reason, and
leaves no backend connection, task or descriptor behind. The session's end is
logged once with who, what and how many bytes, and counted in the metrics.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import pytest
from websockets.exceptions import ConnectionClosed

from tests.server.portforward_support import pf_machine, port_of
from tests.server.test_hostile import raw, status_line, upgrade
from tests.support import (
    GROUP_VERSION,
    Backend,
    Standalone,
    machine,
    open_fds,
    start_standalone,
)
from tests.wsframes import client_frame

TIMEOUT = 20.0
TCP_ESTABLISHED = 1


async def swallow_nothing(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Accept, then never read: the connection's buffers fill and stay full.

    Returns once subres hangs up, which a reader that reads nothing is never
    told: the kernel's TCP state says it.
    """
    # uvloop's transports are only alike asyncio.Transport, not subclasses.
    transport = cast(asyncio.Transport, writer.transport)
    transport.pause_reading()
    sock = writer.get_extra_info("socket")
    while sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] == TCP_ESTABLISHED:  # noqa: ASYNC110 - nothing signals a peer's FIN to a paused reader
        await asyncio.sleep(0.02)


async def reset_after_hello(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Read the first bytes, then reset the connection (RST, not FIN)."""
    await reader.read(1)
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@pytest.fixture
async def stuck() -> AsyncIterator[Backend]:
    b = await Backend(handler=swallow_nothing).start_tcp()
    yield b
    await b.stop()


@pytest.fixture
async def resetting() -> AsyncIterator[Backend]:
    b = await Backend(handler=reset_after_hello).start_tcp()
    yield b
    await b.stop()


def session_config(**overrides: Any) -> dict[str, Any]:
    return {"pingInterval": 1, **overrides}


async def until(predicate: Callable[[], bool]) -> None:
    """Poll `predicate` (states nothing signals: counts of sessions, tasks, descriptors)."""
    async with asyncio.timeout(TIMEOUT):
        while not predicate():  # noqa: ASYNC110 - no event exists for these counts
            await asyncio.sleep(0.02)


async def flood_until_closed(conn: Any) -> ConnectionClosed:
    """Send until the server closes the WebSocket; the close it sent."""
    chunk = os.urandom(1 << 16)
    with pytest.raises(ConnectionClosed) as closed:
        async with asyncio.timeout(TIMEOUT):
            while True:
                await conn.send(chunk)
    return closed.value


async def test_backend_that_takes_nothing_ends_the_session_with_1011(
    tmp_path: Path, stuck: Backend
) -> None:
    async with start_standalone(
        tmp_path,
        machine("vm1", console=stuck.url),
        session=session_config(backendWriteTimeout=1),
    ) as subres:
        async with subres.websocket(subres.url("vm1")) as conn:
            closed = await flood_until_closed(conn)
        assert closed.rcvd is not None
        assert closed.rcvd.code == 1011
        assert closed.rcvd.reason == "backend connection failed: the backend took no data for 1s"
        await stuck.wait_open(0)
        await until(lambda: len(subres.server.state.sessions) == 0)


async def test_backend_reset_is_1011_with_the_os_reason(tmp_path: Path, resetting: Backend) -> None:
    async with start_standalone(tmp_path, machine("vm1", console=resetting.url)) as subres:
        for dialect in ("v5.channel.k8s.io", "plain.kubevirt.io"):
            async with subres.websocket(subres.url("vm1"), dialect) as conn:
                await conn.send(b"\x00hello" if dialect.startswith("v5") else b"hello")
                with pytest.raises(ConnectionClosed) as closed:
                    async with asyncio.timeout(TIMEOUT):
                        while True:
                            await conn.recv()
            assert closed.value.rcvd is not None
            assert closed.value.rcvd.code == 1011
            assert closed.value.rcvd.reason == "backend connection failed: Connection reset by peer"


async def test_port_forward_backend_reset_is_1011(tmp_path: Path, resetting: Backend) -> None:
    port = port_of(resetting.url)
    async with start_standalone(tmp_path, pf_machine("vm1", [port])) as subres:
        async with subres.websocket(subres.url("vm1", f"portforward/{port}")) as conn:
            await conn.send(b"hello")
            with pytest.raises(ConnectionClosed) as closed:
                async with asyncio.timeout(TIMEOUT):
                    await conn.recv()
        assert closed.value.rcvd is not None
        assert closed.value.rcvd.code == 1011
        assert "Connection reset by peer" in closed.value.rcvd.reason


Opener = Callable[[Standalone, Backend], Awaitable[tuple[asyncio.StreamWriter, bytes]]]


async def console_upgrade(
    subres: Standalone, backend: Backend
) -> tuple[asyncio.StreamWriter, bytes]:
    reader, writer = await raw(subres)
    writer.write(upgrade(subres))
    return writer, await status_line(reader)


async def kubevirt_upgrade(
    subres: Standalone, backend: Backend
) -> tuple[asyncio.StreamWriter, bytes]:
    reader, writer = await raw(subres)
    port = port_of(backend.url)
    path = f"/apis/{GROUP_VERSION}/namespaces/default/machines/pf/portforward/{port}"
    writer.write(upgrade(subres, target=path))
    return writer, await status_line(reader)


@pytest.mark.parametrize("opener", [console_upgrade, kubevirt_upgrade], ids=["console", "kubevirt"])
async def test_client_that_vanishes_mid_upload_frees_the_stuck_backend(
    tmp_path: Path, stuck: Backend, opener: Opener
) -> None:
    """The backend reads nothing, so our writes to it block; the client then vanishes.

    Nothing is left waiting: the backend connection closes and the session
    ends long before the (here very long) backend write timeout.
    """
    async with start_standalone(
        tmp_path,
        machine("vm1", console=stuck.url),
        pf_machine("pf", [port_of(stuck.url)]),
        session=session_config(backendWriteTimeout=3600),
    ) as subres:
        tasks, fds = len(asyncio.all_tasks()), open_fds()
        for _ in range(5):
            writer, status = await opener(subres, stuck)
            assert b"101" in status
            frame = client_frame(0x2, os.urandom(1 << 16))
            async with asyncio.timeout(TIMEOUT):
                # Until the server stops taking our bytes: its writes to the backend block.
                while writer.transport.get_write_buffer_size() < 1 << 20:
                    writer.write(frame)
                    await asyncio.sleep(0.01)
            writer.transport.abort()  # no close frame, no FIN: the client is just gone
        await until(lambda: stuck.open == 0)
        await until(lambda: len(subres.server.state.sessions) == 0)
        await until(lambda: len(asyncio.all_tasks()) <= tasks and open_fds() <= fds)


async def test_session_end_is_logged_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    backend = await Backend().start_tcp()
    try:
        async with start_standalone(tmp_path, machine("vm1", console=backend.url)) as subres:
            caplog.set_level(logging.INFO, logger="subres.sessions.session")
            async with subres.websocket(subres.url("vm1"), "v5.channel.k8s.io") as conn:
                await conn.send(b"\x00" + b"x" * 1000)
                received = 0
                async with asyncio.timeout(TIMEOUT):
                    while received < 1000:
                        message = await conn.recv()
                        assert isinstance(message, bytes)
                        received += len(message) - 1
            await until(lambda: len(subres.server.state.sessions) == 0)
            metrics = subres.server.state.metrics.registry
            sent_up = metrics.get_sample_value(
                "subres_bytes_relayed_total",
                {"subresource": "console", "dialect": "v5.channel.k8s.io", "direction": "up"},
            )
            sent_down = metrics.get_sample_value(
                "subres_bytes_relayed_total",
                {"subresource": "console", "dialect": "v5.channel.k8s.io", "direction": "down"},
            )
    finally:
        await backend.stop()
    ended = [r for r in caplog.records if hasattr(r, "fields")]
    assert len(ended) == 1
    fields = ended[0].fields
    assert fields["user"] == "alice" and fields["groups"] == ["devs", "ops", "system:authenticated"]
    assert (fields["subresource"], fields["dialect"]) == ("console", "v5.channel.k8s.io")
    assert (fields["namespace"], fields["name"], fields["kind"]) == ("default", "vm1", "Machine")
    assert (fields["bytesUp"], fields["bytesDown"]) == (1000, 1000)
    assert fields["endedBy"] == "client" and fields["code"] == 1000
    assert fields["client"] == "127.0.0.1" and fields["requestID"]
    assert fields["end"] >= fields["start"]
    assert (sent_up, sent_down) == (1000, 1000)
