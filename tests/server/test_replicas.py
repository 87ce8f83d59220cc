"""Two cluster-mode replicas behind one (fake) apiserver agree on who holds a console or vnc.

Both are the real server from `complete_cluster`, each with its own
apiserver client, watch and session table; they share only the fake
apiserver's Leases. Clients reach each replica with the front-proxy
certificate, as kube-apiserver would after its Service picked one.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from subres.server.run import Server, complete_cluster
from subres.serving import certs
from subres.sessions.leases import USER_ANNOTATION, lease_name
from subres.sessions.registry import SessionKey
from tests.fakeapi import FakeApiServer, start_fake
from tests.server.test_cluster import FAST, PROXY_CA, client_ssl, configmap, options
from tests.support import GROUP_VERSION, Backend, machine, wait_for

PATH = f"/apis/{GROUP_VERSION}/namespaces/default/machines/vm/"


@contextlib.asynccontextmanager
async def replicas(
    tmp: Path, backend: Backend
) -> AsyncIterator[tuple[FakeApiServer, list[Server]]]:
    """A fake apiserver with Machine `vm` (console and vnc on `backend`) and two replicas."""
    async with start_fake(tmp) as fake:
        await fake.put(configmap(), configmap=True)
        vm = machine("vm", console=backend.url)
        vm["status"]["vnc"] = {"endpoint": backend.url}
        await fake.put(vm)
        fake.allow = lambda spec: True
        servers: list[Server] = []
        try:
            for name in ("replica-a", "replica-b"):
                server = await complete_cluster(
                    options(tmp, fake, replica_name=name), informers=FAST
                )
                servers.append(server)
                await server.start()
            await wait_for(lambda: all(_ready(s) for s in servers))
            yield fake, servers
        finally:
            for server in servers:
                await server.stop()


def _ready(server: Server) -> bool:
    return all(check() for check in server.state.readiness.values()) and all(
        c.synced for c in server.state.caches.values()
    )


def as_user(tmp: Path, user: str) -> dict[str, Any]:
    """What aiohttp needs to reach a replica as kube-apiserver's front proxy, for `user`."""
    proxy = certs.issue_client(PROXY_CA, user="front-proxy-client", groups=[])
    return {"ssl": client_ssl(tmp, proxy), "headers": {"X-Remote-User": user}}


async def echoes(ws: aiohttp.ClientWebSocketResponse, data: bytes) -> None:
    """`data` goes to the echo backend and comes back."""
    await ws.send_bytes(data)
    assert await ws.receive_bytes(timeout=5) == data


def url(server: Server, sub: str, query: str = "") -> str:
    return f"wss://127.0.0.1:{server.port}{PATH}{sub}{query}"


# Each test opens its own sessions: the `ws_connect` shape repeats, replica and user differ.


async def test_a_console_taken_over_through_the_other_replica_closes_with_4001(
    tmp_path: Path, backend: Backend
) -> None:
    async with replicas(tmp_path, backend) as (fake, (a, b)), aiohttp.ClientSession() as http:
        async with http.ws_connect(url(a, "console"), **as_user(tmp_path, "alice")) as first:
            await echoes(first, b"mine")
            async with http.ws_connect(url(b, "console"), **as_user(tmp_path, "bob")) as second:
                closing = await first.receive(timeout=5)
                assert closing.type == aiohttp.WSMsgType.CLOSE
                assert (closing.data, closing.extra) == (
                    4001,
                    "console of default/vm taken over by bob",
                )
                await echoes(second, b"now mine")
                lease = fake.lease("subres-system", lease_name(_key("console")))
                assert lease is not None
                assert lease["spec"]["holderIdentity"].startswith("replica-b/")
                assert lease["metadata"]["annotations"][USER_ANNOTATION] == "bob"
        await backend.wait_open(0)
        # Both sessions ended: no Lease is left behind.
        await wait_for(lambda: not fake.leases.objects)


async def test_preserve_session_is_refused_through_the_other_replica(
    tmp_path: Path, backend: Backend
) -> None:
    async with replicas(tmp_path, backend) as (_, (a, b)), aiohttp.ClientSession() as http:
        async with http.ws_connect(url(a, "vnc"), **as_user(tmp_path, "alice")) as held:
            await echoes(held, b"rfb")
            await wait_for(lambda: b.state.sessions.active(_key("vnc")))
            accepted = backend.accepted
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await http.ws_connect(
                    url(b, "vnc", "?preserveSession=true"), **as_user(tmp_path, "bob")
                )
            assert refused.value.status == 409
            assert backend.accepted == accepted  # refused before dialing
            await echoes(held, b"still mine")
        await wait_for(lambda: not b.state.sessions.active(_key("vnc")))
        async with http.ws_connect(
            url(b, "vnc", "?preserveSession=true"), **as_user(tmp_path, "bob")
        ) as kept:
            await echoes(kept, b"free now")


async def test_lease_writes_refused_by_rbac_are_a_503_before_any_upgrade(
    tmp_path: Path, backend: Backend
) -> None:
    async with replicas(tmp_path, backend) as (fake, (a, _)), aiohttp.ClientSession() as http:
        fake.lease_error = 403
        async with http.get(
            url(a, "console").replace("wss://", "https://"),
            headers={
                **as_user(tmp_path, "alice")["headers"],
                "Connection": "Upgrade",
                "Upgrade": "websocket",
                "Sec-WebSocket-Version": "13",
                "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
            },
            ssl=as_user(tmp_path, "alice")["ssl"],
        ) as response:
            assert response.status == 503
            status = json.loads(await response.text())
        assert status["kind"] == "Status" and status["code"] == 503
        assert (
            "cannot coordinate the console of default/vm with other replicas" in (status["message"])
        )
        await backend.wait_open(0)


def _key(sub: str) -> SessionKey:
    return SessionKey("machines", sub, "default", "vm")
