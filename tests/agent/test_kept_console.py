"""A kept console through its node's agent, while that agent is replaced.

The agent that stops tells its relays why; the kept console's writer and
observers are closed with 1001 and that reason (reconnect: the console is
still kept), never a silent 1000; the agent lets go of the socket, and once
an agent serves the node again the keeper dials the console anew.
"""

from __future__ import annotations

import asyncio
from typing import Any

import websockets
from websockets.asyncio.client import ClientConnection

from subres.agent.run import Agent
from tests.agent.conftest import Nodes, agent_options, node_machine
from tests.agent.test_relay import echoed, ws
from tests.support import Backend

V5 = "v5.channel.k8s.io"
WAIT = 15.0
"""Bound on the keeper dialing again: its backoff grew while no agent answered."""


def kept_on_node_a(url: str) -> dict[str, Any]:
    machine = node_machine("vm-a", "node-a", console=url)
    machine["metadata"]["annotations"] = {"subres.dev/keep-console": "true"}
    return machine


async def closed(conn: ClientConnection) -> None:
    async with asyncio.timeout(WAIT):
        try:
            while True:
                await conn.recv()
        except websockets.ConnectionClosed:
            return


async def test_an_agent_that_stops_sends_its_kept_consoles_clients_away_to_come_back(
    nodes: Nodes,
) -> None:
    serial = await Backend().start_unix(nodes.node_a / "serial.sock")
    nodes.subres.write_machines(kept_on_node_a(serial.url))
    subres = nodes.subres
    try:
        await serial.wait_open(1)  # kept, through the agent
        async with (
            ws(subres, "vm-a", "console") as writer,
            subres.websocket(subres.url("vm-a", "console-observe"), V5, user="bob") as observer,
        ):
            assert await echoed(writer, b"before", channel=False) == b"before"
            port = nodes.agent.port
            await nodes.agent.stop()
            await asyncio.gather(closed(writer), closed(observer))
        gone = 'the subres agent of node "node-a" is shutting down'
        assert (writer.close_code, writer.close_reason) == (1001, gone)
        assert (observer.close_code, observer.close_reason) == (1001, gone)
        await serial.wait_open(0)
        successor = Agent(agent_options(nodes.pki, "node-a", nodes.node_a, port=port))
        await successor.start()
        try:
            async with asyncio.timeout(WAIT), serial.changed:
                await serial.changed.wait_for(lambda: serial.open == 1)
            async with ws(subres, "vm-a", "console") as writer:
                await writer.send(b"after")
                got = b""
                async with asyncio.timeout(WAIT):
                    while not got.endswith(b"after"):
                        message = await writer.recv()
                        assert isinstance(message, bytes)
                        got += message
            # The scrollback first (what the console printed before), then the echo.
            assert got == b"beforeafter"
            assert serial.accepted == 2
        finally:
            await successor.stop()
    finally:
        await serial.stop()
