"""The SPDY engine (`subres.engine.spdy`) in the client role against moby/spdystream, the
library of client-go and kubelet.

The Go peer (tools/spdypeer, built by `tests.gotools`) serves on one end of a
socketpair: it accepts every stream, echoes its bytes and half-closes after
we do. Nothing is dialled.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from subres.engine.sockets import SocketStream
from subres.engine.spdy import SpdySession, SpdyStream
from subres.protocol.spdy import Role
from tests import gotools
from tests.server.portforward_support import chunks, digest

TIMEOUT = 30.0
SIZE = 4 << 20


@pytest.fixture(scope="module")
def peer_binary() -> Path:
    # A peer that cannot be built fails the suite: it never skips silently.
    return gotools.build("spdypeer")


@contextlib.asynccontextmanager
async def go_server(binary: Path) -> AsyncIterator[SpdySession]:
    """Our client on a socketpair whose other end `spdypeer server` holds."""
    ours, theirs = socket.socketpair()
    proc = await asyncio.create_subprocess_exec(
        str(binary), "server", str(theirs.fileno()), pass_fds=(theirs.fileno(),)
    )
    theirs.close()
    loop = asyncio.get_running_loop()
    _, carrier = await loop.create_connection(
        lambda: SocketStream(high_water=1 << 20, write_timeout=30.0, peer="peer"), sock=ours
    )
    client = SpdySession(carrier, role=Role.CLIENT, ping_interval=5.0)
    client.start()
    try:
        yield client
    finally:
        await client.close()
        try:
            async with asyncio.timeout(10):
                # spdystream ends once our GOAWAY and hang-up reach it.
                assert await proc.wait() == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


async def echo_digest(stream: SpdyStream, seed: int) -> str:
    """Send `chunks(SIZE, seed)`, half-close, and hash the echo until the peer's FIN."""

    async def send() -> None:
        for chunk in chunks(SIZE, seed=seed):
            await stream.write(chunk)
        await stream.write_eof()

    sender = asyncio.create_task(send())
    h = hashlib.sha256()
    while data := await stream.read():
        h.update(data)
    await sender
    return h.hexdigest()


async def test_concurrent_streams_echoed_with_half_close(peer_binary: Path) -> None:
    async with go_server(peer_binary) as client, asyncio.timeout(TIMEOUT):
        streams = [
            client.open_stream({"streamtype": "data", "port": "80", "requestid": str(i)})
            for i in range(4)
        ]
        for stream in streams:
            await stream.wait_replied()
        digests = await asyncio.gather(*(echo_digest(s, seed) for seed, s in enumerate(streams)))
        assert list(digests) == [digest(SIZE, seed=seed) for seed in range(4)]
        assert client.usable


async def test_reset_stream_leaves_the_others(peer_binary: Path) -> None:
    async with go_server(peer_binary) as client, asyncio.timeout(TIMEOUT):
        doomed = client.open_stream({"streamtype": "error", "port": "80", "requestid": "0"})
        kept = client.open_stream({"streamtype": "data", "port": "80", "requestid": "0"})
        await doomed.wait_replied()
        await kept.wait_replied()
        doomed.reset()
        assert await doomed.read() == b""
        await kept.write(b"still here")
        await kept.write_eof()
        received = b""
        while data := await kept.read():
            received += data
        assert received == b"still here"
