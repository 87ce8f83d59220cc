"""The agent reaps connections that get nowhere, with the server's timers and cap.

Clients that never start TLS, that finish it and say nothing, that trickle a
request head, or that idle after a request, are each closed by the timer
that bounds them; past the unauthenticated cap the oldest go first; a live
relay is busy and no timer touches it.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from subres.agent.run import GUARD, Agent
from subres.serving import certs
from subres.serving.connections import Guard, Limits
from tests import stuck_clients as stuck
from tests.agent.conftest import AgentPKI, agent_options, write_pki
from tests.support import Backend

TIMEOUT = 0.5
CLIENTS = 20
REAPED_WITHIN = 60.0


@asynccontextmanager
async def running(tmp_path: Path, limits: Limits) -> AsyncIterator[tuple[Agent, AgentPKI]]:
    pki = write_pki(tmp_path / "pki")
    (tmp_path / "node-a").mkdir()
    agent = Agent(agent_options(pki, "node-a", tmp_path / "node-a", connections=limits))
    await agent.start()
    try:
        yield agent, pki
    finally:
        await agent.stop()


@pytest.fixture
async def agent(tmp_path: Path) -> AsyncIterator[tuple[Agent, AgentPKI]]:
    # The handshake gets longer: a busy 2-core machine may take a while to finish one.
    async with running(tmp_path, Limits(4 * TIMEOUT, TIMEOUT, TIMEOUT, CLIENTS)) as started:
        yield started


def replica_tls(pki: AgentPKI, tmp_path: Path, pair: certs.KeyPair | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca_file))
    context.check_hostname = False  # the stuck clients dial 127.0.0.1 as "localhost"
    (pair or certs.issue_replica_client(pki.ca)).write(tmp_path / "c.crt", tmp_path / "c.key")
    context.load_cert_chain(tmp_path / "c.crt", tmp_path / "c.key")
    return context


def guard(agent: Agent) -> Guard:
    return agent.runner.app[GUARD]


async def all_closed(clients: list[stuck.Stuck]) -> None:
    async with asyncio.timeout(REAPED_WITHIN):
        await asyncio.gather(*(client.closed_by_server() for client in clients))


async def idle_after_a_request(port: int, tls: ssl.SSLContext) -> stuck.Stuck:
    reader, writer = await stuck.tls_connection(port, tls)
    writer.write(b"GET /relay HTTP/1.1\r\nHost: agent\r\n\r\n")  # 405, and keep-alive
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 405"), head
    length = re.search(rb"Content-Length: (\d+)", head)
    assert length is not None, head
    await reader.readexactly(int(length.group(1)))  # the Status
    return stuck.Stuck(reader, writer)


async def test_connections_that_get_nowhere_are_closed_by_their_timers(
    agent: tuple[Agent, AgentPKI], tmp_path: Path
) -> None:
    server, pki = agent
    tls = replica_tls(pki, tmp_path)
    backend = await Backend().start_unix(tmp_path / "node-a" / "vm.sock")
    try:
        live = await stuck.tls_connection(server.port, tls)  # a relay, busy throughout
        live[1].write(
            b"POST /relay HTTP/1.1\r\nHost: agent\r\nConnection: Upgrade\r\n"
            b"Upgrade: subres-relay.v1\r\n" + f"Subres-Endpoint: {backend.url}\r\n\r\n".encode()
        )
        assert (await live[0].readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 101")
        clients = [await stuck.no_handshake(server.port) for _ in range(CLIENTS)]
        await all_closed(clients)
        for opener, reason in (
            (stuck.idle_tls, "request-header-timeout"),
            (
                lambda port, tls: stuck.slowloris(port, tls, every=TIMEOUT / 4),
                "request-header-timeout",
            ),
            (idle_after_a_request, "idle-timeout"),
        ):
            before = guard(server).reaped[reason]
            await all_closed([await opener(server.port, tls) for _ in range(CLIENTS // 4)])
            assert guard(server).reaped[reason] == before + CLIENTS // 4
        assert backend.open == 1 and not live[1].is_closing()
        live[1].close()
    finally:
        await backend.stop()


async def test_past_the_unauthenticated_cap_the_oldest_go_first(tmp_path: Path) -> None:
    async with running(tmp_path, Limits(max_unauthenticated=CLIENTS)) as (server, pki):
        # A certificate of the right CA but no replica's name: TLS passes, a relay never would.
        stranger = certs.issue_client(pki.ca, user="intruder", groups=[])
        tls = replica_tls(pki, tmp_path, stranger)
        clients = [await stuck.idle_tls(server.port, tls) for _ in range(CLIENTS + 5)]
        await all_closed(clients[:5])
        assert guard(server).reaped == {"evicted": 5}
        for client in clients[5:]:
            client.writer.close()
