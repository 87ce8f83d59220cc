"""Two (or more) cluster-mode replicas behind one fake apiserver, as their Pods would run.

Each is the real server from `complete_cluster` with its own apiserver
client, membership Lease and watches, and its peer port on loopback with the
replica certificate. Each replica's Pod is put in the fake apiserver (Ready,
127.0.0.1, its `peer` port), as the kubelet would. Clients reach each
replica with the front-proxy certificate, as kube-apiserver would after its
Service picked one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from subres.server.run import Server, complete_cluster
from subres.serving import certs
from subres.sessions.registry import SessionKey
from tests.fakeapi import FakeApiServer, start_fake
from tests.server.test_cluster import FAST, PROXY_CA, client_ssl, configmap, options
from tests.support import GROUP_VERSION, LOOPBACK_POLICY, Backend, machine, wait_for

__all__ = [
    "PATH",
    "as_user",
    "echoes",
    "owner_and_other",
    "pod",
    "replicas",
    "unit",
    "url",
]

PATH = f"/apis/{GROUP_VERSION}/namespaces/default/machines/vm/"
REPLICA_CA = certs.generate_ca("replica-ca")


def pod(name: str, peer_port: int, *, ready: bool = True) -> dict[str, Any]:
    """A replica's Pod as the kubelet reports it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "subres-system",
            "labels": {"app.kubernetes.io/name": "subres", "app.kubernetes.io/component": "server"},
        },
        "spec": {
            "containers": [
                {"name": "subres", "ports": [{"name": "peer", "containerPort": peer_port}]}
            ]
        },
        "status": {
            "podIP": "127.0.0.1",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.asynccontextmanager
async def replicas(
    tmp: Path,
    backend: Backend,
    *,
    names: tuple[str, ...] = ("replica-a", "replica-b"),
    config: Callable[[str], dict[str, Any]] | None = None,
    annotations: dict[str, str] | None = None,
    **changes: Any,
) -> AsyncIterator[tuple[FakeApiServer, list[Server]]]:
    """A fake apiserver with Machine `vm` (console and vnc on `backend`) and the replicas.

    `config(replica)` is each replica's configuration beyond the endpoint policy.
    """
    REPLICA_CA.write(tmp / "replica-ca.crt", tmp / "replica-ca.key")
    certs.issue_replica_client(REPLICA_CA).write(tmp / "replica.crt", tmp / "replica.key")
    async with start_fake(tmp) as fake:
        await fake.put(configmap(), configmap=True)
        vm = machine("vm", console=backend.url, annotations=annotations or {})
        vm["status"]["vnc"] = {"endpoint": backend.url}
        await fake.put(vm)
        fake.allow = lambda spec: True
        servers: list[Server] = []
        try:
            for name in names:
                servers.append(await _start(tmp, fake, name, config, **changes))
            await wait_for(lambda: all(_ready(s, names) for s in servers))
            yield fake, servers
        finally:
            for server in servers:
                await server.stop()


async def _start(
    tmp: Path,
    fake: FakeApiServer,
    name: str,
    config: Callable[[str], dict[str, Any]] | None,
    **changes: Any,
) -> Server:
    port = _free_port()
    await fake.put_pod(pod(name, port))
    # Shorter than shipped, so that membership changes are quick; `changes` may say otherwise.
    membership = {"member_duration": 3.0, "member_renew": 1.0}
    base = options(
        tmp,
        fake,
        replica_name=name,
        peer_port=port,
        agent_ca_file=tmp / "replica-ca.crt",
        agent_client_cert_file=tmp / "replica.crt",
        agent_client_key_file=tmp / "replica.key",
        session_audit_log=str(tmp / f"audit-{name}.jsonl"),
        **(membership | changes),
    )
    if config is not None:
        path = tmp / f"config-{name}.yaml"
        path.write_text(yaml.safe_dump({"endpointPolicy": LOOPBACK_POLICY} | config(name)))
        base = dataclasses.replace(base, config=path)
    server = await complete_cluster(base, informers=FAST)
    await server.start()
    return server


def _ready(server: Server, names: tuple[str, ...]) -> bool:
    return (
        all(check() for check in server.state.readiness.values())
        and all(c.synced for c in server.state.caches.values())
        and set(server.state.owners.members) == set(names)
        and server.state.owners.settled
    )


def unit(sub: str = "console") -> SessionKey:
    """Machine `vm`'s unit for `sub`."""
    return SessionKey("machines", sub, "default", "vm")


def owner_and_other(servers: list[Server], sub: str = "console") -> tuple[Server, Server]:
    """The replica that owns `vm`'s `sub`, and another one."""
    owner_name = servers[0].state.owners.owner(unit(sub))
    owner = next(s for s in servers if s.state.replica == owner_name)
    other = next(s for s in servers if s is not owner)
    return owner, other


def as_user(tmp: Path, user: str) -> dict[str, Any]:
    """What aiohttp needs to reach a replica as kube-apiserver's front proxy, for `user`."""
    proxy = certs.issue_client(PROXY_CA, user="front-proxy-client", groups=[])
    return {"ssl": client_ssl(tmp, proxy), "headers": {"X-Remote-User": user}}


async def echoes(ws: aiohttp.ClientWebSocketResponse, data: bytes) -> None:
    """`data` goes to the echo backend and comes back."""
    await ws.send_bytes(data)
    got = b""
    while len(got) < len(data):
        got += await ws.receive_bytes(timeout=5)
    assert got == data


def url(server: Server, sub: str, query: str = "") -> str:
    """The WebSocket URL of `vm`'s `sub` on `server`."""
    return f"wss://127.0.0.1:{server.port}{PATH}{sub}{query}"
