"""Every subresource through node-a's real agent, and every way a relay is refused.

A Machine on node-a whose console is a unix socket in node-a's directory is
reached replica → mTLS → agent → socket: bytes arrive intact in every
dialect, half-closes cross, datagrams keep their boundaries. A Machine on a
node without an agent, or asking for a socket the agent's own policy does
not allow, is refused with a Status before any upgrade and no backend ever
sees a connection.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import logging
import os
from pathlib import Path

import aiohttp
import pytest
import websockets
from PIL import Image
from websockets.asyncio.client import ClientConnection, connect

from subres.demo.vnc import Display, VncServer
from tests.agent.conftest import Nodes, node_machine
from tests.server.kubepeer import forwarding, run_exec
from tests.server.portforward_support import UdpEcho, port_of, sha_on_eof
from tests.support import Backend, Standalone

V5 = "v5.channel.k8s.io"


def ws(subres: Standalone, name: str, sub: str, *protocols: str) -> connect:
    """The shared websockets client recipe, for subresource `sub` of Machine `name`."""
    return subres.websocket(subres.url(name, sub), *protocols)


async def echoed(conn: ClientConnection, payload: bytes, *, channel: bool) -> bytes:
    """Send `payload` in 64 KiB messages (stdin-framed when `channel`) and collect the echo."""
    step = 64 << 10

    async def send() -> None:
        for i in range(0, len(payload), step):
            part = payload[i : i + step]
            await conn.send(b"\x00" + part if channel else part)

    async def receive() -> bytes:
        got = bytearray()
        while len(got) < len(payload):
            message = await conn.recv()
            assert isinstance(message, bytes)
            if channel:
                assert message[:1] == b"\x01", message[:10]
                message = message[1:]
            got += message
        return bytes(got)

    async with asyncio.timeout(30):
        _, back = await asyncio.gather(send(), receive())
    return back


async def refusal(subres: Standalone, name: str, sub: str = "console") -> tuple[int, str]:
    with pytest.raises(websockets.InvalidStatus) as caught:
        async with ws(subres, name, sub):
            pass
    response = caught.value.response
    status = json.loads(response.body or b"{}")
    assert status.get("kind") == "Status", status
    return response.status_code, str(status.get("message"))


@pytest.fixture
async def console_a(nodes: Nodes) -> Backend:
    backend = await Backend().start_unix(nodes.node_a / "serial.sock")
    nodes.subres.write_machines(node_machine("vm-a", "node-a", console=backend.url))
    return backend


@pytest.mark.parametrize("protocol", ["", "plain.kubevirt.io", V5, "v4.channel.k8s.io"])
async def test_console_through_the_agent_in_every_websocket_dialect(
    nodes: Nodes, console_a: Backend, protocol: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="subres.agent.relay")
    payload = os.urandom(1 << 20)
    channel = protocol not in {"", "plain.kubevirt.io"}
    async with ws(nodes.subres, "vm-a", "console", *([protocol] if protocol else [])) as conn:
        if channel:
            assert await conn.recv() == b"\x01"  # the stream is up
        back = await echoed(conn, payload, channel=channel)
    assert hashlib.sha256(back).digest() == hashlib.sha256(payload).digest()
    assert console_a.accepted == 1
    await console_a.wait_open(0)
    relayed = f"relaying {console_a.url} for Machine default/vm-a (Transport.STREAM)"
    assert any(relayed in r.getMessage() for r in caplog.records), caplog.text


@pytest.mark.parametrize("transport", ["spdy", "websocket"])
async def test_client_go_exec_through_the_agent(
    nodes: Nodes, console_a: Backend, kubepeer_bin: Path, transport: str
) -> None:
    payload = os.urandom(2 << 20)
    result = await run_exec(kubepeer_bin, nodes.subres, "vm-a", payload, transport=transport)
    assert result.code == 0, result.stderr
    assert result.stdout == payload
    await console_a.wait_open(0)


async def test_port_forward_through_the_agent_half_closes_and_replies(
    nodes: Nodes, kubepeer_bin: Path
) -> None:
    summer = await Backend(handler=sha_on_eof).start_tcp()
    port = port_of(summer.url)
    try:
        nodes.subres.write_machines(node_machine("vm-a", "node-a", ports=[port]))
        payload = os.urandom(3 << 20)
        # KubeVirt style: the client's close frame is a half-close; the reply still comes.
        async with ws(nodes.subres, "vm-a", f"portforward/{port}") as conn:
            for i in range(0, len(payload), 1 << 16):
                await conn.send(payload[i : i + (1 << 16)])
            closing = asyncio.create_task(conn.close())
            async with asyncio.timeout(10):
                reply = await conn.recv()
            await closing
        assert reply == hashlib.sha256(payload).hexdigest().encode()
        # client-go's SPDY forwarder: its write half-close crosses the agent as well.
        async with forwarding(kubepeer_bin, nodes.subres, "vm-a", port, transport="spdy") as pf:
            reader, writer = await asyncio.open_connection("127.0.0.1", pf.ports[port])
            writer.write(payload)
            writer.write_eof()
            async with asyncio.timeout(20):
                assert await reader.read() == hashlib.sha256(payload).hexdigest().encode()
            writer.close()
        assert summer.accepted == 2
    finally:
        await summer.stop()


async def test_udp_port_forward_through_the_agent_keeps_datagrams(nodes: Nodes) -> None:
    udp = await UdpEcho().start()
    try:
        nodes.subres.write_machines(node_machine("vm-a", "node-a", ports=[udp.port]))
        datagrams = [bytes([i]) * n for i, n in enumerate((1, 2, 512, 1400, 9000, 65507))]
        async with ws(nodes.subres, "vm-a", f"portforward/{udp.port}/udp") as conn:
            back = []
            async with asyncio.timeout(10):
                for datagram in datagrams:
                    await conn.send(datagram)
                    back.append(await conn.recv())
        assert back == datagrams == udp.received
    finally:
        udp.stop()


async def test_vnc_and_screenshot_through_the_agent(nodes: Nodes) -> None:
    display = Display(clock=lambda: "12:00:00")
    server = VncServer(nodes.node_a / "vnc.sock", display=display)
    await server.start()
    try:
        url = f"unix://{nodes.node_a / 'vnc.sock'}"
        nodes.subres.write_machines(node_machine("vm-a", "node-a", vnc=url))
        async with ws(nodes.subres, "vm-a", "vnc", "binary") as conn:
            assert await asyncio.wait_for(conn.recv(), 10) == b"RFB 003.008\n"
        status, body = await get(nodes.subres, "vm-a", "screenshot")
        assert status == 200, body
        image = Image.open(io.BytesIO(body))
        assert image.size == (display.width, display.height)
        assert image.convert("RGB").tobytes() == bytes(display.rgb)
    finally:
        await server.stop()


async def get(subres: Standalone, name: str, sub: str) -> tuple[int, bytes]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(
            subres.url(name, sub, scheme="https"),
            ssl=subres.client_ssl,
            headers=subres.auth,
            timeout=aiohttp.ClientTimeout(total=20),
        ) as response,
    ):
        return response.status, await response.read()


# -- refusals --------------------------------------------------------------------------


async def test_a_node_without_an_agent_gets_503_naming_the_node(nodes: Nodes) -> None:
    backend = await Backend().start_unix(nodes.node_b / "serial.sock")
    try:
        nodes.subres.write_machines(node_machine("vm-b", "node-b", console=backend.url))
        code, message = await refusal(nodes.subres, "vm-b")
        assert code == 503
        assert 'no subres agent serves node "node-b"' in message
        assert "Machine default/vm-b" in message
        assert backend.accepted == 0
    finally:
        await backend.stop()


async def test_the_agent_refuses_sockets_outside_its_directories(nodes: Nodes) -> None:
    outside = await Backend().start_unix(nodes.outside / "serial.sock")
    # A symlink inside node-a's directory leads outside it: resolved, then refused.
    (nodes.node_a / "sneaky.sock").symlink_to(nodes.outside / "serial.sock")
    try:
        for name, url in (
            ("vm-out", outside.url),
            ("vm-link", f"unix://{nodes.node_a / 'sneaky.sock'}"),
        ):
            nodes.subres.write_machines(node_machine(name, "node-a", console=url))
            code, message = await refusal(nodes.subres, name)
            assert code == 403, message
            assert 'agent on node "node-a"' in message
            assert "outside the allowed directories" in message
        assert outside.accepted == 0
    finally:
        await outside.stop()


async def test_the_agents_failed_dial_is_503_with_its_reason(nodes: Nodes) -> None:
    missing = f"unix://{nodes.node_a / 'gone.sock'}"
    nodes.subres.write_machines(node_machine("vm-a", "node-a", console=missing))
    code, message = await refusal(nodes.subres, "vm-a")
    assert code == 503
    assert 'agent on node "node-a": cannot connect to' in message


async def test_an_unreachable_agent_is_503_naming_the_node(nodes: Nodes) -> None:
    backend = await Backend().start_unix(nodes.node_a / "serial.sock")
    try:
        nodes.subres.write_machines(node_machine("vm-a", "node-a", console=backend.url))
        await nodes.agent.stop()
        code, message = await refusal(nodes.subres, "vm-a")
        assert code == 503
        assert 'the subres agent of node "node-a"' in message
        assert "unreachable" in message
        assert backend.accepted == 0
    finally:
        await backend.stop()
