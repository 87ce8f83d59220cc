"""Port-forward over SPDY/3.1 and tunnelled SPDY against client-go's own forwarder (kubepeer)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.server.kubepeer import Forwarder, forwarding, pf_machine
from tests.support import Backend, Standalone, open_fds, start_standalone, wait_for

BULK_SIZE = int(os.environ.get("SUBRES_BULK_MIB", "64")) << 20
"""Bytes sent each way in the bulk test (SUBRES_BULK_MIB=256 for the issue's goal)."""
CHUNK = 256 << 10
CONCURRENT = 50
TRANSPORTS = ["spdy", "websocket"]


def port(backend: Backend) -> int:
    return int(backend.url.rsplit(":", 1)[1])


async def sha_on_eof(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answer, after the client's EOF only, with the sha256 of everything received."""
    digest = hashlib.sha256()
    while data := await reader.read(65536):
        digest.update(data)
    writer.write(digest.hexdigest().encode())
    await writer.drain()


async def read_some_then_reset(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Read a little, then reset the connection (RST, not FIN)."""
    await reader.read(1024)
    writer.transport.abort()


@pytest.fixture
async def backends() -> AsyncIterator[dict[str, Backend]]:
    started = {
        "echo": await Backend().start_tcp(),
        "sha": await Backend(handler=sha_on_eof).start_tcp(),
        "reset": await Backend(handler=read_some_then_reset).start_tcp(),
    }
    yield started
    for backend in started.values():
        await backend.stop()


@pytest.fixture
async def subres(tmp_path: Path, backends: dict[str, Backend]) -> AsyncIterator[Standalone]:
    allowed = [port(b) for b in backends.values()]
    async with start_standalone(
        tmp_path, pf_machine("vm1", allowed), pf_machine("stopped", allowed, phase="Stopped")
    ) as s:
        yield s


async def connect(fwd: Forwarder, remote: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", fwd.ports[remote], limit=1 << 20)


async def echo_round_trip(fwd: Forwarder, remote: int, size: int) -> tuple[bytes, bytes]:
    """Send `size` random bytes through an echo backend; the digests sent and received."""
    reader, writer = await connect(fwd, remote)
    sent, got = hashlib.sha256(), hashlib.sha256()
    rng = random.Random(size)

    async def send() -> None:
        left = size
        while left:
            chunk = rng.randbytes(min(CHUNK, left))
            sent.update(chunk)
            writer.write(chunk)
            await writer.drain()
            left -= len(chunk)
        writer.write_eof()

    sender = asyncio.create_task(send())
    received = 0
    while data := await reader.read(1 << 20):
        got.update(data)
        received += len(data)
    await sender
    writer.close()
    assert received == size
    return sent.digest(), got.digest()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_bulk_transfer_hashes_match(
    subres: Standalone, backends: dict[str, Backend], kubepeer_bin: Path, transport: str
) -> None:
    echo_port = port(backends["echo"])
    async with forwarding(kubepeer_bin, subres, "vm1", echo_port, transport=transport) as fwd:
        started = time.monotonic()
        async with asyncio.timeout(300):
            sent, got = await echo_round_trip(fwd, echo_port, BULK_SIZE)
        elapsed = time.monotonic() - started
    assert sent == got
    mib = BULK_SIZE >> 20
    print(
        f"\n{transport}: {mib} MiB each way in {elapsed:.2f}s = {mib / elapsed:.0f} MiB/s each way"
    )


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_fifty_concurrent_connections_share_one_upgrade(
    subres: Standalone, backends: dict[str, Backend], kubepeer_bin: Path, transport: str
) -> None:
    echo_port = port(backends["echo"])
    async with forwarding(kubepeer_bin, subres, "vm1", echo_port, transport=transport) as fwd:
        async with asyncio.timeout(120):
            results = await asyncio.gather(
                *(echo_round_trip(fwd, echo_port, 1 << 20) for _ in range(CONCURRENT))
            )
        assert all(sent == got for sent, got in results)
        assert backends["echo"].accepted == CONCURRENT
    await backends["echo"].wait_open(0)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_half_close_reaches_backend_and_reply_flows_back(
    subres: Standalone, backends: dict[str, Backend], kubepeer_bin: Path, transport: str
) -> None:
    sha_port = port(backends["sha"])
    payload = os.urandom(3 << 20)
    async with forwarding(kubepeer_bin, subres, "vm1", sha_port, transport=transport) as fwd:
        reader, writer = await connect(fwd, sha_port)
        writer.write(payload)
        writer.write_eof()
        async with asyncio.timeout(30):
            reply = await reader.read()
        writer.close()
    assert reply.decode() == hashlib.sha256(payload).hexdigest()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_backend_reset_ends_one_connection_not_the_forwarder(
    subres: Standalone, backends: dict[str, Backend], kubepeer_bin: Path, transport: str
) -> None:
    reset_port, echo_port = port(backends["reset"]), port(backends["echo"])
    async with forwarding(
        kubepeer_bin, subres, "vm1", reset_port, echo_port, transport=transport
    ) as fwd:
        reader, writer = await connect(fwd, reset_port)
        writer.write(os.urandom(4096))
        async with asyncio.timeout(10):
            # The local end sees EOF or a reset, depending on timing; either way it ends.
            with contextlib.suppress(ConnectionResetError):
                while await reader.read(65536):
                    pass
        writer.close()
        sent, got = await echo_round_trip(fwd, echo_port, 1 << 20)
        assert sent == got
    await backends["reset"].wait_open(0)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_vanishing_client_leaks_no_task_or_socket(
    subres: Standalone, backends: dict[str, Backend], kubepeer_bin: Path, transport: str
) -> None:
    tasks, fds = len(asyncio.all_tasks()), open_fds()
    echo_port = port(backends["echo"])
    async with forwarding(kubepeer_bin, subres, "vm1", echo_port, transport=transport) as fwd:
        transfers = [asyncio.create_task(echo_round_trip(fwd, echo_port, 64 << 20)) for _ in "ab"]
        await backends["echo"].wait_open(2)
        fwd.kill()
        await asyncio.wait(transfers, timeout=30)
        for transfer in transfers:
            assert transfer.done()
            transfer.exception()  # the local side breaks too: consumed, not checked
    await backends["echo"].wait_open(0)
    await wait_for(lambda: len(asyncio.all_tasks()) <= tasks and open_fds() <= fds)
    assert len(subres.server.state.sessions) == 0


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_disallowed_port_is_reported_by_client_go(
    subres: Standalone, backends: dict[str, Backend], kubepeer_bin: Path, transport: str
) -> None:
    async with forwarding(kubepeer_bin, subres, "vm1", 9, transport=transport) as fwd:
        reader, writer = await connect(fwd, 9)
        async with asyncio.timeout(10):
            assert await reader.read() == b""
        writer.close()
        # Any text on the error stream makes client-go drop the whole connection.
        async with asyncio.timeout(10):
            await fwd.proc.wait()
        stderr = await fwd.stderr()
    assert "Machine default/vm1 does not allow forwarding to tcp port 9" in stderr
    assert all(b.accepted == 0 for b in backends.values())


async def test_machine_is_resolved_before_the_upgrade(
    subres: Standalone, backends: dict[str, Backend], kubepeer_bin: Path
) -> None:
    for name, wanted in (("stopped", "is not Running"), ("ghost", "not found")):
        with pytest.raises(AssertionError, match=wanted):
            async with forwarding(kubepeer_bin, subres, name, 80, transport="spdy"):
                pass
