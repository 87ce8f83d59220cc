"""The console as client-go's exec sees it: SPDY remote-command and the v5 WebSocket (kubepeer)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests.server.kubepeer import pf_machine, run_exec, start_exec
from tests.support import Backend, Standalone, start_standalone


@pytest.fixture
async def subres(tmp_path: Path, backend: Backend) -> AsyncIterator[Standalone]:
    async with start_standalone(
        tmp_path,
        pf_machine("vm1", [], console=backend.url),
        pf_machine("stopped", [], console=backend.url, phase="Stopped"),
    ) as s:
        yield s


@pytest.mark.parametrize("tty", [False, True])
@pytest.mark.parametrize("transport", ["spdy", "websocket"])
async def test_exec_echoes_stdin_and_exits_zero(
    subres: Standalone, backend: Backend, kubepeer_bin: Path, transport: str, tty: bool
) -> None:
    payload = os.urandom(2 << 20)
    result = await run_exec(kubepeer_bin, subres, "vm1", payload, transport=transport, tty=tty)
    assert result.code == 0, result.stderr
    assert result.stdout == payload
    await backend.wait_open(0)


async def test_refused_machine_is_a_status_before_upgrade(
    subres: Standalone, kubepeer_bin: Path
) -> None:
    result = await run_exec(kubepeer_bin, subres, "stopped", b"", transport="spdy")
    assert result.code == 1
    assert "is not Running" in result.stderr


async def test_second_spdy_console_takes_over(
    subres: Standalone, backend: Backend, kubepeer_bin: Path
) -> None:
    first = await start_exec(kubepeer_bin, subres, "vm1", transport="spdy")
    try:
        await backend.wait_open(1)
        second = await run_exec(kubepeer_bin, subres, "vm1", b"hello", transport="spdy")
        async with asyncio.timeout(20):
            _, err = await first.communicate()
    finally:
        if first.returncode is None:
            first.kill()
            await first.wait()
    assert second.code == 0 and second.stdout == b"hello"
    assert first.returncode == 1
    assert "console of default/vm1 taken over by alice" in err.decode()


async def test_unsupported_protocols_get_403_listing_ours(subres: Standalone) -> None:
    headers = {
        **subres.auth,
        "Connection": "Upgrade",
        "Upgrade": "SPDY/3.1",
        "X-Stream-Protocol-Version": "v9.channel.k8s.io, v8.channel.k8s.io",
    }
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            subres.url("vm1", scheme="https"), headers=headers, ssl=subres.client_ssl
        ) as resp,
    ):
        assert resp.status == 403
        accepted = resp.headers.getall("X-Accepted-Stream-Protocol-Versions")
        body = await resp.json()
    assert accepted == [
        "v4.channel.k8s.io",
        "v3.channel.k8s.io",
        "v2.channel.k8s.io",
        "channel.k8s.io",
    ]
    assert body["kind"] == "Status" and "v9.channel.k8s.io" in body["message"]
