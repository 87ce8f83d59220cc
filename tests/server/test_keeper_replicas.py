"""Two cluster-mode replicas keep one console once, through a session Lease.

Both are the real server against the fake apiserver and its Leases. The
machine opts in to a kept console; exactly one replica dials it, the other
answers its writers 503 naming why; when the keeping replica stops, the
other takes the console over (the real-apiserver e2e kills the replica).
"""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from subres.server.run import Server
from subres.sessions.leases import lease_name
from subres.sessions.registry import SessionKey
from tests.server.test_replicas import as_user, echoes, replicas, url
from tests.support import Backend, machine, wait_for

KEEPER_SLOT = SessionKey("machines", "console-keeper", "default", "vm")


def keeping(server: Server) -> bool:
    return server.state.metrics.registry.get_sample_value("subres_consoles_kept") == 1


async def test_one_replica_keeps_the_console_and_the_other_takes_over_when_it_stops(
    tmp_path: Path, backend: Backend
) -> None:
    async with replicas(tmp_path, backend) as (fake, (a, b)), aiohttp.ClientSession() as http:
        vm = machine("vm", console=backend.url)
        vm["metadata"]["annotations"] = {"subres.dev/keep-console": "true"}
        await fake.put(vm)
        await wait_for(lambda: keeping(a) or keeping(b))
        holder, other = (a, b) if keeping(a) else (b, a)
        await backend.wait_open(1)
        lease = fake.lease("subres-system", lease_name(KEEPER_SLOT))
        assert lease is not None
        name = "replica-a" if holder is a else "replica-b"
        assert lease["spec"]["holderIdentity"].startswith(f"{name}/")
        # The writer of the replica that keeps it shares the kept connection...
        async with http.ws_connect(url(holder, "console"), **as_user(tmp_path, "alice")) as ws:
            await echoes(ws, b"kept")
        assert backend.accepted == 1
        # ...the other replica dials nothing and says why.
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(url(other, "console"), **as_user(tmp_path, "bob"))
        assert refused.value.status == 503
        assert backend.accepted == 1
        await holder.stop()
        await wait_for(lambda: keeping(other))
        await backend.wait_open(1)
        moved = fake.lease("subres-system", lease_name(KEEPER_SLOT))
        assert moved is not None and not moved["spec"]["holderIdentity"].startswith(f"{name}/")
        async with http.ws_connect(url(other, "console"), **as_user(tmp_path, "bob")) as ws:
            await echoes(ws, b"kept elsewhere")


async def test_each_replica_lists_the_writer_the_other_one_serves(
    tmp_path: Path, backend: Backend
) -> None:
    async with replicas(tmp_path, backend) as (_, (a, b)), aiohttp.ClientSession() as http:
        async with http.ws_connect(url(a, "console"), **as_user(tmp_path, "alice")) as ws:
            await echoes(ws, b"mine")
            await wait_for(
                lambda: b.state.sessions.active(SessionKey("machines", "console", "default", "vm"))
            )
            sessions = url(b, "sessions").replace("wss://", "https://")
            async with http.get(sessions, **as_user(tmp_path, "bob")) as r:
                listing = await r.json()
        (item,) = listing["items"]
        assert (item["user"], item["mode"], item["replica"]) == ("alice", "writer", "replica-a")
        assert (item["bytesUp"], item["clientAddress"]) == (None, "")
        assert item["since"].endswith("Z")
