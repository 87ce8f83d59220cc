"""Port-forward clients that vanish mid-transfer leave no task, socket or session behind."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import websockets
from websockets.asyncio.client import connect

from tests.server.portforward_support import UdpEcho, chunks, pf_machine, port_of
from tests.support import Backend, Standalone, open_fds, start_standalone, wait_for


@pytest.fixture
async def udp() -> AsyncIterator[UdpEcho]:
    u = await UdpEcho().start()
    yield u
    u.stop()


@pytest.fixture
async def subres(tmp_path: Path, echo: Backend, udp: UdpEcho) -> AsyncIterator[Standalone]:
    async with start_standalone(tmp_path, pf_machine("vm1", [port_of(echo.url), udp.port])) as s:
        yield s


def paths(echo: Backend, udp: UdpEcho) -> dict[str, tuple[str, bytes]]:
    """Per dialect: the path and the prefix of a data message."""
    port = port_of(echo.url)
    return {
        "kubevirt-tcp": (f"portforward/{port}", b""),
        "kubevirt-udp": (f"portforward/{udp.port}/udp", b""),
        "channels": (f"portforward?ports={port},{port}", b"\x00"),
    }


@pytest.mark.parametrize("dialect", ["kubevirt-tcp", "kubevirt-udp", "channels"])
async def test_clients_that_vanish_mid_transfer_leave_nothing(
    subres: Standalone, echo: Backend, udp: UdpEcho, dialect: str
) -> None:
    path, head = paths(echo, udp)[dialect]
    tasks, fds = len(asyncio.all_tasks()), open_fds()
    for round_ in range(10):
        ws = await connect(
            subres.url("vm1", path),
            ssl=subres.client_ssl,
            additional_headers=subres.auth,
            subprotocols=[websockets.Subprotocol("v4.channel.k8s.io")] if head else None,
            compression=None,
            max_size=None,
            open_timeout=5,
        )
        # Send without reading, so that the server is mid-write when the client goes.
        for chunk in chunks(
            2 << 20 if dialect != "kubevirt-udp" else 64 << 10, seed=round_, chunk=16384
        ):
            await ws.send(head + chunk)
        # No close frame, no TLS close_notify: the TCP connection just goes.
        ws.transport.abort()
        await asyncio.wait_for(ws.wait_closed(), 5)
    await echo.wait_open(0)
    await wait_for(lambda: len(subres.server.state.sessions) == 0)
    await wait_for(lambda: len(asyncio.all_tasks()) <= tasks and open_fds() <= fds)


async def test_many_ports_on_one_websocket_all_close(subres: Standalone, echo: Backend) -> None:
    port = port_of(echo.url)
    tasks, fds = len(asyncio.all_tasks()), open_fds()
    async with connect(
        subres.url("vm1", "portforward?ports=" + ",".join([str(port)] * 40)),
        ssl=subres.client_ssl,
        additional_headers=subres.auth,
        compression=None,
        open_timeout=5,
    ) as ws:
        for _ in range(80):
            await asyncio.wait_for(ws.recv(), 5)
        await echo.wait_open(40)
    await echo.wait_open(0)
    await wait_for(lambda: len(subres.server.state.sessions) == 0)
    await wait_for(lambda: len(asyncio.all_tasks()) <= tasks and open_fds() <= fds)
