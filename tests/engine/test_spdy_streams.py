"""`SpdyStream` state comes from the codec's table; only a peer's reset is tolerated.

Two `SpdySession`s, client and server, on the ends of a socketpair: nothing
is dialled.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import pytest

from subres.engine.sockets import SocketStream
from subres.engine.spdy import SpdySession, SpdyStream
from subres.protocol.spdy import Role, StreamState, UsageError

TIMEOUT = 10.0


async def _carrier(sock: socket.socket) -> SocketStream:
    loop = asyncio.get_running_loop()
    _, carrier = await loop.create_connection(
        lambda: SocketStream(high_water=1 << 20, write_timeout=TIMEOUT, peer="peer"), sock=sock
    )
    return carrier


@contextlib.asynccontextmanager
async def pair() -> AsyncIterator[tuple[SpdySession, SpdySession]]:
    ours, theirs = socket.socketpair()
    client = SpdySession(await _carrier(ours), role=Role.CLIENT)
    server = SpdySession(await _carrier(theirs), role=Role.SERVER)
    async with client, server, asyncio.timeout(TIMEOUT):
        yield client, server


async def opened(client: SpdySession, server: SpdySession) -> tuple[SpdyStream, SpdyStream]:
    ours = client.open_stream({"streamtype": "data"})
    theirs = await server.accept()
    assert theirs is not None
    theirs.reply()
    await ours.wait_replied()
    return ours, theirs


async def test_state_follows_both_half_closes() -> None:
    async with pair() as (client, server):
        ours, theirs = await opened(client, server)
        assert {ours.state, theirs.state} == {StreamState.OPEN}
        await ours.write(b"hello")
        await ours.write_eof()
        assert ours.state is StreamState.HALF_CLOSED_LOCAL
        assert await theirs.read() == b"hello"
        assert await theirs.read() == b""
        assert theirs.state is StreamState.HALF_CLOSED_REMOTE and not theirs.gone
        await theirs.write(b"bye")
        await theirs.write_eof()
        assert theirs.gone
        assert await ours.read() == b"bye"
        assert await ours.read() == b""
        assert ours.gone


async def test_a_peer_reset_ends_writes_and_is_no_error() -> None:
    async with pair() as (client, server):
        ours, theirs = await opened(client, server)
        theirs.reset()
        assert theirs.gone
        assert await ours.read() == b""
        assert ours.gone
        with pytest.raises(ConnectionResetError):
            await ours.write(b"too late")
        ours.reset()  # a stream already let go: nothing to send, nothing raised
        await ours.write_eof()


async def test_a_usage_error_raises() -> None:
    async with pair() as (client, server):
        _, theirs = await opened(client, server)
        with pytest.raises(UsageError):
            theirs.reply()  # a second SYN_REPLY is our bug, not the peer's


async def test_a_reply_that_came_with_a_reset_still_counts() -> None:
    async with pair() as (client, server):
        ours = client.open_stream({"streamtype": "error"})
        theirs = await server.accept()
        assert theirs is not None
        theirs.reply()
        theirs.reset()  # both frames leave in one write, and arrive in one read
        assert await ours.read() == b""
        assert ours.gone
        await ours.wait_replied()  # the stream was accepted, then ended: no refusal
