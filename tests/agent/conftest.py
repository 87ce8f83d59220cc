"""A replica and the real node agent of node-a on loopback, with their mutual-TLS PKI.

node-a's agent dials sockets under `<tmp>/node-a` and TCP/UDP on 127.0.0.0/8;
node-b has no agent. The replica is a standalone subres told where node-a's
agent is (`--agent`), whose own policy allows every socket under `<tmp>`, so
that what is refused is refused by the agent, and whose port-forward
endpoints are node-local.
"""

from __future__ import annotations

import asyncio
import re
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from subres.agent.options import AgentOptions
from subres.agent.run import Agent
from subres.serving import certs
from tests.support import Standalone, node_local_config, start_standalone

__all__ = ["AgentPKI", "AgentProcess", "Nodes", "node_machine"]

NAMESPACE = "subres-system"
AGENT_START_TIMEOUT = 30.0


@dataclass(frozen=True)
class AgentPKI:
    """One CA; the agents' serving pair; the replicas' client pair."""

    dir: Path
    ca: certs.KeyPair

    @property
    def ca_file(self) -> Path:
        return self.dir / "ca.crt"

    def pair(self, name: str) -> tuple[Path, Path]:
        return self.dir / f"{name}.crt", self.dir / f"{name}.key"


def write_pki(directory: Path) -> AgentPKI:
    """Agent CA, agent serving certificate and replica client certificate in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = certs.generate_ca("agents test CA")
    ca.write(directory / "ca.crt", directory / "ca.key")
    certs.issue_agent_serving(ca, namespace=NAMESPACE).write(
        directory / "agent.crt", directory / "agent.key"
    )
    certs.issue_replica_client(ca).write(directory / "replica.crt", directory / "replica.key")
    return AgentPKI(directory, ca)


def agent_options(pki: AgentPKI, node: str, socket_dir: Path, **extra: Any) -> AgentOptions:
    cert, key = pki.pair("agent")
    settings: dict[str, Any] = {
        "node_name": node,
        "bind_address": "127.0.0.1",
        "port": 0,
        "tls_cert_file": cert,
        "tls_private_key_file": key,
        "client_ca_file": pki.ca_file,
        "allowed_names": (certs.REPLICA_IDENTITY,),
        "socket_dirs": (socket_dir,),
        "allow_tcp": ("127.0.0.0/8",),
        "connect_timeout": 2.0,
        "read_size": 65536,
    }
    settings.update(extra)
    return AgentOptions(**settings)


def replica_options(pki: AgentPKI, agents: dict[str, str]) -> dict[str, Any]:
    """Standalone flags that make a replica use `agents` (node → URL)."""
    cert, key = pki.pair("replica")
    return {
        "agents": tuple(agents.items()),
        "agent_ca_file": pki.ca_file,
        "agent_client_cert_file": cert,
        "agent_client_key_file": key,
        "agent_server_name": f"{certs.AGENT_SERVICE}.{NAMESPACE}.svc",
    }


NODE_LOCAL_PORTFORWARD = node_local_config("portforward")


def node_machine(
    name: str,
    node: str,
    *,
    console: str | None = None,
    vnc: str | None = None,
    ports: list[int] | None = None,
) -> dict[str, Any]:
    """A Running Machine on `node` (`.status.nodeName`), its backends in `.status`."""
    status: dict[str, Any] = {"phase": "Running", "nodeName": node}
    if console is not None:
        status["console"] = {"endpoint": console}
    if vnc is not None:
        status["vnc"] = {"endpoint": vnc}
    if ports is not None:
        status["portForward"] = {"address": "127.0.0.1", "ports": ports}
    return {
        "apiVersion": "subres.dev/v1alpha1",
        "kind": "Machine",
        "metadata": {"name": name, "namespace": "default"},
        "status": status,
    }


@dataclass
class Nodes:
    """The replica, node-a's running agent and the directories of both nodes."""

    subres: Standalone
    agent: Agent
    pki: AgentPKI
    node_a: Path
    """node-a's socket directory (the agent's)."""
    node_b: Path
    """node-b's, which no agent serves."""
    outside: Path
    """A directory the replica allows and the agent does not."""

    @property
    def agent_url(self) -> str:
        return f"https://127.0.0.1:{self.agent.port}"


@pytest.fixture
async def nodes(tmp_path: Path) -> AsyncIterator[Nodes]:
    pki = write_pki(tmp_path / "pki")
    dirs = [tmp_path / name for name in ("node-a", "node-b", "outside")]
    for directory in dirs:
        directory.mkdir()
    agent = Agent(agent_options(pki, "node-a", dirs[0]))
    await agent.start()
    try:
        agents = {"node-a": f"https://127.0.0.1:{agent.port}"}
        async with start_standalone(
            tmp_path, config=NODE_LOCAL_PORTFORWARD, options=replica_options(pki, agents)
        ) as subres:
            yield Nodes(subres, agent, pki, *dirs)
    finally:
        await agent.stop()


@dataclass
class AgentProcess:
    """`subres agent` for node-a as a process of its own (`agent`), and its PKI."""

    proc: asyncio.subprocess.Process
    url: str
    pki: AgentPKI
    socket_dir: Path


@pytest.fixture
async def agent(tmp_path: Path) -> AsyncIterator[AgentProcess]:
    """node-a's agent as a process (signals reach it: SIGKILL, SIGSTOP), stopped by PID."""
    pki = write_pki(tmp_path / "pki")
    socket_dir = tmp_path / "node-a"
    socket_dir.mkdir()
    cert, key = pki.pair("agent")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "subres", "agent", "--node-name=node-a",
        "--bind-address=127.0.0.1", "--port=0", f"--tls-cert-file={cert}",
        f"--tls-private-key-file={key}", f"--client-ca-file={pki.ca_file}",
        f"--socket-dir={socket_dir}", "--allow-tcp=127.0.0.0/8",
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        async with asyncio.timeout(AGENT_START_TIMEOUT):
            while line := await proc.stderr.readline():
                if found := re.search(rb"serving on (https://[\d.]+:\d+)", line):
                    break
            else:
                raise AssertionError(f"agent exited with {await proc.wait()}")
        yield AgentProcess(proc, found.group(1).decode(), pki, socket_dir)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(10):
                await proc.wait()
