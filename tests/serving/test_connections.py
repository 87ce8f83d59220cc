"""Connections that never get anywhere are reaped: idle TLS, slowloris, idle keep-alive.

A thousand clients of each kind, on loopback against the real server with
short timeouts. What is asserted is what a user of the server would see: each
client's connection is closed by the server, the server says which timer
closed it, and afterwards the server holds no connection and no descriptor
more than before. Authenticated sessions live through it all.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from websockets.asyncio.client import connect

from subres.server.options import Options, add_arguments
from subres.serving.connections import Guard, GuardedSite, Limits
from tests import stuck_clients as stuck
from tests.support import Backend, Standalone, machine, open_fds, start_standalone, wait_for

CLIENTS = 1000
OPENING = 100
"""Connections being opened at once (a busy 2-core machine handshakes a few hundred a second);
once open, each stays open until the server closes it."""
TIMEOUT = 2.0
REAPED_WITHIN = 120.0
"""Bound on every client seeing its connection closed (opening 1,000 takes most of it)."""
SHORT = Limits(
    tls_handshake_timeout=TIMEOUT,
    request_header_timeout=TIMEOUT,
    idle_timeout=TIMEOUT,
    max_unauthenticated=10 * CLIENTS,
)

Client = Callable[[Standalone], Awaitable[stuck.Stuck]]


@pytest.fixture
async def subres(tmp_path: Path, backend: Backend) -> AsyncIterator[Standalone]:
    async with start_standalone(
        tmp_path, machine("vm1", console=backend.url), options={"connections": SHORT}
    ) as s:
        yield s


async def idle_tls(subres: Standalone) -> stuck.Stuck:
    return await stuck.idle_tls(subres.server.port, subres.client_ssl)


async def slowloris(subres: Standalone) -> stuck.Stuck:
    return await stuck.slowloris(subres.server.port, subres.client_ssl, every=TIMEOUT / 4)


async def keepalive_after_one_request(subres: Standalone) -> stuck.Stuck:
    return await stuck.keepalive_after_one_request(subres.server.port, subres.client_ssl)


async def no_handshake(subres: Standalone) -> stuck.Stuck:
    return await stuck.no_handshake(subres.server.port)


async def run_clients(subres: Standalone, client: Client) -> None:
    """Open CLIENTS stuck connections (OPENING at a time), then wait until each is closed."""
    opening = asyncio.Semaphore(OPENING)

    async def one() -> None:
        async with opening:
            connection = await client(subres)
        await connection.closed_by_server()

    async with asyncio.timeout(REAPED_WITHIN):
        await asyncio.gather(*(one() for _ in range(CLIENTS)))


@pytest.mark.parametrize(
    ("client", "reason"),
    [
        (idle_tls, "request-header-timeout"),
        (slowloris, "request-header-timeout"),
        (keepalive_after_one_request, "idle-timeout"),
    ],
)
async def test_a_thousand_stuck_connections_are_reaped_and_leave_nothing(
    subres: Standalone, backend: Backend, client: Client, reason: str
) -> None:
    guard = subres.server.state.connections
    async with connect(
        subres.url("vm1"), ssl=subres.client_ssl, additional_headers=subres.auth
    ) as session:
        await backend.wait_open(1)
        fds = open_fds()
        await run_clients(subres, client)
        assert guard.reaped[reason] == CLIENTS, guard.reaped
        # The session's connection is busy, so no timer touched it.
        await session.send(b"still here")
        assert await session.recv() == b"still here"
        await wait_for(lambda: guard.open == 1 and open_fds() <= fds)
    assert sum(guard.reaped.values()) == CLIENTS


async def test_a_thousand_connections_that_never_start_tls_are_reaped(
    subres: Standalone,
) -> None:
    fds = open_fds()
    reclaimer = subres.server.state.reclaimer
    runs = reclaimer.runs
    await run_clients(subres, no_handshake)
    guard = subres.server.state.connections
    assert guard.open == 0 and sum(guard.reaped.values()) == 0  # never got past TLS
    await wait_for(lambda: open_fds() <= fds)
    # Nothing tells asyncio's caller of a failed handshake; the guard still knows when
    # they have all ended, and the memory they held is reclaimed.
    await wait_for(lambda: guard.handshaking == 0)
    await wait_for(lambda: reclaimer.runs > runs)


async def test_beyond_the_cap_the_oldest_unauthenticated_connection_goes(
    tmp_path: Path, backend: Backend
) -> None:
    cap = Limits(max_unauthenticated=10)
    async with start_standalone(
        tmp_path, machine("vm1", console=backend.url), options={"connections": cap}
    ) as s:
        guard = s.server.state.connections
        idle = [await stuck.tls_connection(s.server.port, s.client_ssl) for _ in range(10)]
        await wait_for(lambda: guard.unauthenticated == 10)
        # A session's connection arrives while the cap is full: the oldest idle one goes,
        # and once authenticated the session no longer counts against the cap.
        async with connect(s.url("vm1"), ssl=s.client_ssl, additional_headers=s.auth) as ws:
            await stuck.closed_by_server(idle[0][0])
            assert guard.reaped["evicted"] == 1 and guard.unauthenticated == 9
            later = [await stuck.tls_connection(s.server.port, s.client_ssl) for _ in range(5)]
            for reader, _ in idle[1:5]:
                await stuck.closed_by_server(reader)
            assert guard.reaped["evicted"] == 5 and guard.unauthenticated == 10
            await ws.send(b"authenticated")
            assert await ws.recv() == b"authenticated"
        for _, writer in idle + later:
            writer.close()


def serve_options(*argv: str) -> Options:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return Options.from_args(parser.parse_args(list(argv)))


def test_flags_and_their_defaults() -> None:
    parsed = serve_options(
        "--tls-handshake-timeout=5s", "--request-header-timeout=1m", "--idle-timeout=2m30s"
    )
    assert parsed.connections == Limits(
        tls_handshake_timeout=5, request_header_timeout=60, idle_timeout=150
    )
    assert serve_options().connections == Limits(10, 32, 90, 1000)
    bad = serve_options("--idle-timeout=0", "--max-unauthenticated-connections=0")
    assert bad.validate() == [
        "--idle-timeout must be positive",
        "--max-unauthenticated-connections must be at least 1",
    ]


async def test_vanished_clients_leave_no_connection_objects_behind(
    tmp_path: Path, backend: Backend
) -> None:
    """A handler cancelled by a lost connection ends after it: no timer (here the
    default 90 s idle one) may then keep the dead connection's objects alive.

    (aiohttp's own heartbeat timer keeps them until the next ping is due: the
    1 s ping interval keeps that wait short.)"""
    # RequestHandler has slots without __weakref__: remember identities instead (no new
    # handler is made once the loop is done, so none can take over an identity).
    handlers: set[int] = set()
    vm = machine("vm1", console=backend.url)
    async with start_standalone(tmp_path, vm, session={"pingInterval": 1}) as subres:
        assert subres.server.runner is not None and subres.server.runner.server is not None
        server = subres.server.runner.server
        for _ in range(20):
            ws = await subres.websocket(subres.url("vm1")).__aenter__()
            await ws.send(b"x")
            assert await ws.recv() == b"x"
            handlers |= {id(h) for h in server.connections}
            ws.transport.abort()  # the client vanishes without a close frame
            await backend.wait_open(0)
        await wait_for(lambda: subres.server.state.connections.open == 0)

        def alive() -> int:
            gc.collect()
            return sum(
                isinstance(o, RequestHandler) and id(o) in handlers for o in gc.get_objects()
            )

        await wait_for(lambda: alive() == 0)


async def test_a_port_cannot_be_guarded_without_the_guards_timers() -> None:
    """Only an application built by a guard, with the middlewares that stop its timers for
    every request (an upgraded session's whole life included), can be served behind it."""
    bare = web.AppRunner(web.Application())
    await bare.setup()
    try:
        with pytest.raises(TypeError, match="built by its guard"):
            GuardedSite(bare, host="127.0.0.1", port=0, ssl_context=None, backlog=8)
    finally:
        await bare.cleanup()
    guard = Guard(SHORT)
    built = web.AppRunner(guard.application([], authenticated=lambda _: True))
    await built.setup()
    try:
        site = GuardedSite(built, host="127.0.0.1", port=0, ssl_context=None, backlog=8)
        assert site._guard is guard
    finally:
        await built.cleanup()
