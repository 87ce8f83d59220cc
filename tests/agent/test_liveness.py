"""Relays that beat: a silent end is given up, an idle or slow one is not.

A network cut sends no FIN; here the silent end is an agent frozen with
SIGSTOP (its kernel still acknowledges every byte, as a live peer's would,
but it sends nothing), or a replica that asked for heartbeats and never beats.
Either way the other end drops the relay within `relay.MISSED_BEATS`
intervals, says why, and the agent closes its backend: a socket that takes
one connection at a time (a VM's serial port) is free for the next.
"""

from __future__ import annotations

import asyncio
import hashlib
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from subres.agent.run import Agent
from subres.backends import endpoint as endpoints
from subres.backends.agent import (
    Agents,
    ClientTLS,
    RelayStream,
    Request,
    StaticDirectory,
    open_relay,
)
from subres.config import EndpointPolicySpec
from subres.protocol import relay
from subres.serving import certs
from tests.agent.conftest import NAMESPACE, AgentPKI, AgentProcess, agent_options, write_pki
from tests.support import Backend

BEAT = 0.2
"""Seconds between heartbeats here: a silent end is given up within a second."""
WAIT = 10.0
SERVER_NAME = f"{certs.AGENT_SERVICE}.{NAMESPACE}.svc"


def agents_of(pki: AgentPKI, url: str) -> Agents:
    cert, key = pki.pair("replica")
    tls = ClientTLS(cert=cert, key=key, ca=pki.ca_file, server_name=SERVER_NAME)
    return Agents(directory=StaticDirectory({"node-a": url}), tls=tls)


async def dial(agents: Agents, backend: Backend, socket_dir: Path) -> RelayStream:
    target = await endpoints.check(
        endpoints.parse(backend.url), EndpointPolicySpec(socket_dirs=(str(socket_dir),))
    )
    return await agents.dial(
        "node-a",
        target,
        datagram=False,
        connect_timeout=5,
        read_size=65536,
        write_timeout=30,
        heartbeat=BEAT,
    )


async def echoes(stream: RelayStream, data: bytes) -> None:
    await stream.write(data)
    got = b""
    async with asyncio.timeout(WAIT):
        while len(got) < len(data):
            got += await stream.read()
    assert got == data


async def test_a_frozen_agent_is_given_up_and_frees_the_socket_once_thawed(
    agent: AgentProcess,
) -> None:
    backend = await Backend().start_unix(agent.socket_dir / "serial.sock")
    try:
        stream = await dial(agents_of(agent.pki, agent.url), backend, agent.socket_dir)
        await echoes(stream, b"ping")
        agent.proc.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(
                ConnectionResetError, match=r'agent of node "node-a" .* stopped answering'
            ):
                async with asyncio.timeout(WAIT):
                    await stream.read()
        finally:
            agent.proc.send_signal(signal.SIGCONT)
        await stream.close()
        # Thawed, the agent finds its replica gone and lets go of the backend.
        await backend.wait_open(0)
    finally:
        await backend.stop()


@pytest.fixture
async def in_process(tmp_path: Path) -> AsyncIterator[tuple[Agent, AgentPKI, Path]]:
    pki = write_pki(tmp_path / "pki")
    socket_dir = tmp_path / "node-a"
    socket_dir.mkdir()
    agent = Agent(agent_options(pki, "node-a", socket_dir))
    await agent.start()
    try:
        yield agent, pki, socket_dir
    finally:
        await agent.stop()


async def test_a_replica_that_stops_beating_is_dropped_and_its_backend_closed(
    in_process: tuple[Agent, AgentPKI, Path],
) -> None:
    agent, pki, socket_dir = in_process
    backend = await Backend().start_unix(socket_dir / "serial.sock")
    cert, key = pki.pair("replica")
    tls = ClientTLS(cert=cert, key=key, ca=pki.ca_file, server_name=SERVER_NAME)
    headers = [
        (relay.ENDPOINT_HEADER, backend.url),
        (relay.TRANSPORT_HEADER, "stream"),
        # Asked for, then never sent: the replica as a network cut leaves it.
        (relay.HEARTBEAT_HEADER, f"{BEAT:g}"),
    ]
    try:
        stream = await open_relay(
            lambda: RelayStream(high_water=1 << 18, write_timeout=30, where="the agent"),
            ("127.0.0.1", agent.port),
            context=tls.context(),
            server_name=tls.server_name,
            connect_timeout=5,
            request=Request(relay.PATH, relay.UPGRADE, "subres-agent", headers),
        )
        assert stream.answer[relay.HEARTBEAT_HEADER.lower()] == f"{BEAT:g}"
        await backend.wait_open(1)
        async with asyncio.timeout(WAIT):
            await backend.wait_open(0)
        with pytest.raises(ConnectionResetError, match="the agent was lost"):
            async with asyncio.timeout(WAIT):
                while await stream.read():
                    pass
        await stream.close()
    finally:
        await backend.stop()


async def test_an_idle_relay_that_beats_lives_on(in_process: tuple[Agent, AgentPKI, Path]) -> None:
    agent, pki, socket_dir = in_process
    backend = await Backend().start_unix(socket_dir / "serial.sock")
    try:
        stream = await dial(agents_of(pki, f"https://127.0.0.1:{agent.port}"), backend, socket_dir)
        await echoes(stream, b"before")
        # Idle for twice the silence either end tolerates: the heartbeats are all it hears.
        await asyncio.sleep(2 * BEAT * relay.MISSED_BEATS)
        await echoes(stream, b"after")
        assert backend.open == 1
        await stream.close()
    finally:
        await backend.stop()


async def test_a_replica_that_reads_nothing_for_a_while_loses_nothing(
    in_process: tuple[Agent, AgentPKI, Path],
) -> None:
    """Backpressure is not silence: paused reading stops the count on both ends."""
    agent, pki, socket_dir = in_process
    sent = hashlib.sha256()
    size = 16 << 20

    async def flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        chunk = bytes(range(256)) * 256
        for _ in range(size // len(chunk)):
            sent.update(chunk)
            writer.write(chunk)
            await writer.drain()
        writer.close()

    backend = await Backend(handler=flood).start_unix(socket_dir / "flood.sock")
    try:
        stream = await dial(agents_of(pki, f"https://127.0.0.1:{agent.port}"), backend, socket_dir)
        # The relay fills up and stalls, unread, for twice the silence tolerated.
        await asyncio.sleep(2 * BEAT * relay.MISSED_BEATS)
        received = hashlib.sha256()
        total = 0
        async with asyncio.timeout(WAIT):
            while chunk := await stream.read():
                received.update(chunk)
                total += len(chunk)
        assert total == size
        assert received.digest() == sent.digest()
        await stream.close()
    finally:
        await backend.stop()
