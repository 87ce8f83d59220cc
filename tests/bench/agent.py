"""A node agent for the benchmarks: its PKI, the process, and the replica's flags for it.

Benchmarks measure the agent as deployed: `subres agent` in its own process
with mutual TLS, a replica told where it is (`--agent`), and Machines on its
node whose console is node-local (`nodeLocal: true`), so the replica dials
them through it. Started and stopped by PID like every bench process.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from subres.serving import certs
from tests.bench.procs import Child, spawn, wait_listening
from tests.support import node_local_config

__all__ = ["NODE", "BenchAgent", "node_local_console", "start_agent"]

NODE = "bench-node"


def node_local_console() -> dict[str, Any]:
    """A --config parent list whose console endpoints are on the machine's node."""
    return node_local_config("console")


@dataclass
class BenchAgent:
    """A running agent and the flags that make a replica use it."""

    child: Child
    flags: list[str]


async def start_agent(root: Path, *, log: Path) -> BenchAgent:
    """Write the agent PKI under `root/agent-pki`, start the agent, wait until it listens."""
    pki = root / "agent-pki"
    pki.mkdir(parents=True, exist_ok=True)
    ca = certs.generate_ca("bench agent CA")
    ca.write(pki / "ca.crt", pki / "ca.key")
    certs.issue_agent_serving(ca, namespace="subres-system").write(
        pki / "agent.crt", pki / "agent.key"
    )
    certs.issue_replica_client(ca).write(pki / "replica.crt", pki / "replica.key")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    child = await spawn(
        "subres agent", "subres", "agent", f"--node-name={NODE}", "--bind-address=127.0.0.1",
        f"--port={port}", f"--tls-cert-file={pki / 'agent.crt'}",
        f"--tls-private-key-file={pki / 'agent.key'}", f"--client-ca-file={pki / 'ca.crt'}",
        "--allow-tcp=127.0.0.0/8", log=log, stops_on_eof=False,
    )  # fmt: skip
    await wait_listening(child, port)
    flags = [
        f"--agent={NODE}=https://127.0.0.1:{port}",
        f"--agent-ca-file={pki / 'ca.crt'}",
        f"--agent-client-cert-file={pki / 'replica.crt'}",
        f"--agent-client-key-file={pki / 'replica.key'}",
    ]
    return BenchAgent(child, flags)
