"""`subres agent` as its own process: who it lets in, what it dials, and dying mid-session.

The agent trusts no replica's policy: a caller with the replica's own
certificate still cannot make it dial outside its directories or networks;
callers without the replicas' CA or identity never get as far. Killed with
SIGKILL while relaying, it ends the user's session with 1011 and a reason
naming its node.
"""

from __future__ import annotations

import asyncio
import json
import signal
import ssl
from pathlib import Path

import aiohttp
import pytest
import websockets

from subres.backends import endpoint as endpoints
from subres.backends.agent import Agents, ClientTLS, StaticDirectory
from subres.config import EndpointPolicySpec
from subres.protocol import relay
from subres.serving import certs
from tests.agent.conftest import (
    NAMESPACE,
    NODE_LOCAL_PORTFORWARD,
    AgentPKI,
    AgentProcess,
    node_machine,
    replica_options,
)
from tests.agent.test_relay import echoed, ws
from tests.server.test_cve_regressions import certificate_without_usages, proxy_certificate
from tests.support import Backend, start_standalone

SERVER_NAME = f"{certs.AGENT_SERVICE}.{NAMESPACE}.svc"


def client_context(pki: AgentPKI, pair: certs.KeyPair | None, tmp: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca_file))
    if pair is not None:
        pair.write(tmp / "caller.crt", tmp / "caller.key")
        context.load_cert_chain(tmp / "caller.crt", tmp / "caller.key")
    return context


async def ask(
    agent: AgentProcess, context: ssl.SSLContext, endpoint: str, transport: str = "stream"
) -> tuple[int, str]:
    """A relay request straight to the agent; its status and Status message."""
    headers = {
        "Connection": "Upgrade",
        "Upgrade": relay.UPGRADE,
        relay.ENDPOINT_HEADER: endpoint,
        relay.TRANSPORT_HEADER: transport,
    }
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http,
        http.post(
            agent.url + relay.PATH, headers=headers, ssl=context, server_hostname=SERVER_NAME
        ) as response,
    ):
        body = await response.read()
    return response.status, str(json.loads(body).get("message")) if body else ""


async def test_only_replicas_of_the_agents_ca_and_identity_get_in(
    agent: AgentProcess, tmp_path: Path
) -> None:
    backend = await Backend().start_unix(agent.socket_dir / "serial.sock")
    try:
        for stranger in (None, certs.issue_client(certs.generate_ca("other"), user="x", groups=[])):
            with pytest.raises(aiohttp.ClientError):
                await ask(agent, client_context(agent.pki, stranger, tmp_path), backend.url)
        intruder = certs.issue_client(agent.pki.ca, user="intruder", groups=[])
        code, message = await ask(agent, client_context(agent.pki, intruder, tmp_path), backend.url)
        assert (code, message) == (401, "certificate 'intruder' is not an allowed replica identity")
        assert backend.accepted == 0
    finally:
        await backend.stop()


async def test_a_certificate_of_the_agents_ca_naming_no_usage_is_refused_and_logged(
    agent: AgentProcess, tmp_path: Path
) -> None:
    backend = await Backend().start_unix(agent.socket_dir / "serial.sock")
    try:
        bare = certificate_without_usages(agent.pki.ca, certs.REPLICA_IDENTITY)
        code, message = await ask(agent, client_context(agent.pki, bare, tmp_path), backend.url)
        reason = (
            "certificate 'subres-replica' names no extended key usage, "
            "and a replica's says clientAuth"
        )
        assert (code, message) == (401, reason)
        assert backend.accepted == 0
        said = await logged(agent, reason)
        assert "Traceback" not in said and "BEGIN" not in said, said
        assert f"serial {bare.cert.serial_number:x}" in said
    finally:
        await backend.stop()


async def logged(agent: AgentProcess, text: str) -> str:
    """What the agent wrote on stderr up to the line that says `text`."""
    assert agent.proc.stderr is not None
    said = ""
    async with asyncio.timeout(10):
        while text not in said:
            line = await agent.proc.stderr.readline()
            assert line, f"the agent ended without saying {text!r}: {said}"
            said += line.decode(errors="replace")
    return said


async def test_a_replica_cannot_widen_the_agents_policy(
    agent: AgentProcess, tmp_path: Path
) -> None:
    replica = client_context(agent.pki, certs.issue_replica_client(agent.pki.ca), tmp_path)
    refused = {
        "unix:///run/elsewhere.sock": (403, "outside the allowed directories"),
        f"unix://{agent.socket_dir}/../pki/ca.key": (403, "outside the allowed directories"),
        "tcp://10.1.2.3:22": (403, "not allowed by the endpoint policy"),
        "tcp://169.254.169.254:80": (403, "not allowed by the endpoint policy"),
        "ssh://root@127.0.0.1:22": (403, "endpoint scheme 'ssh' is not allowed"),
    }
    for endpoint, (want, text) in refused.items():
        code, message = await ask(agent, replica, endpoint)
        assert code == want and text in message, (endpoint, code, message)
        assert message.startswith('agent on node "node-a": '), message
    code, message = await ask(agent, replica, f"unix://{agent.socket_dir}/x", "datagram")
    assert code == 400 and "not datagrams" in message


async def test_an_agent_killed_mid_session_ends_it_with_1011(
    agent: AgentProcess, tmp_path: Path
) -> None:
    backend = await Backend().start_unix(agent.socket_dir / "serial.sock")
    replica = tmp_path / "replica"
    replica.mkdir()
    try:
        async with start_standalone(
            replica,
            node_machine("vm-a", "node-a", console=backend.url),
            config={
                **NODE_LOCAL_PORTFORWARD,
                "endpointPolicy": {"socketDirs": [str(agent.socket_dir)]},
            },
            options=replica_options(agent.pki, {"node-a": agent.url}),
        ) as subres:
            async with ws(subres, "vm-a", "console") as conn:
                assert await echoed(conn, b"before", channel=False) == b"before"
                agent.proc.send_signal(signal.SIGKILL)
                with pytest.raises(websockets.ConnectionClosedError):
                    async with asyncio.timeout(10):
                        await conn.recv()
            assert conn.close_code == 1011
            assert 'agent of node "node-a"' in (conn.close_reason or "")
    finally:
        await backend.stop()


async def test_a_lost_agent_is_an_error_to_the_reader_never_a_clean_end(
    agent: AgentProcess,
) -> None:
    # The contract the session path relies on for its 1011: read raises, it does not return b"".
    backend = await Backend().start_unix(agent.socket_dir / "serial.sock")
    cert, key = agent.pki.pair("replica")
    tls = ClientTLS(cert=cert, key=key, ca=agent.pki.ca_file, server_name=SERVER_NAME)
    agents = Agents(directory=StaticDirectory({"node-a": agent.url}), tls=tls)
    target = await endpoints.check(
        endpoints.parse(backend.url), EndpointPolicySpec(socket_dirs=(str(agent.socket_dir),))
    )
    try:
        stream = await agents.dial(
            "node-a", target, datagram=False, connect_timeout=5, read_size=65536, write_timeout=30
        )
        await stream.write(b"ping")
        assert await asyncio.wait_for(stream.read(), 5) == b"ping"
        agent.proc.send_signal(signal.SIGKILL)
        with pytest.raises(ConnectionResetError, match=r'agent of node "node-a" .* was lost'):
            await asyncio.wait_for(stream.read(), 10)
        await stream.close()
    finally:
        await backend.stop()


async def test_a_replicas_name_beside_another_is_no_replica(
    agent: AgentProcess, tmp_path: Path
) -> None:
    backend = await Backend().start_unix(agent.socket_dir / "serial.sock")
    try:
        for names in (("subres-replica", "intruder"), ("intruder", "subres-replica")):
            pair = proxy_certificate(agent.pki.ca, *names)
            code, message = await ask(agent, client_context(agent.pki, pair, tmp_path), backend.url)
            assert code == 401 and "not an allowed replica identity" in message, message
        assert backend.accepted == 0
    finally:
        await backend.stop()
