"""A replica's drain: readiness drops first, nothing moves or closes before the shutdown delay.

Two real replicas (`tests.server.replicas`). The owner of `vm`'s console
drains (`Server.drain`, what SIGTERM runs) while a writer reaches the console
through the other replica (relayed) and an observer through the owner. During
`--shutdown-delay` the owner is not ready but still a member, still holds its
Lease and serves both; only after it do its units move and its clients get
1001, so that they reconnect through a replica the endpoints still name.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp

from tests.server.replicas import as_user, echoes, owner_and_other, replicas, url
from tests.support import Backend

DELAY = 3.0
"""The owner's `--shutdown-delay`, seconds."""


async def test_a_draining_owner_fails_readiness_first_and_moves_nothing_before_the_delay(
    tmp_path: Path, backend: Backend
) -> None:
    loop = asyncio.get_running_loop()
    async with (
        replicas(tmp_path, backend, shutdown_delay=DELAY) as (fake, servers),
        aiohttp.ClientSession() as http,
    ):
        owner, other = owner_and_other(servers)
        lease = f"subres-replica-{owner.state.replica}"
        async with (
            http.ws_connect(url(other, "console"), **as_user(tmp_path, "alice")) as relayed,
            http.ws_connect(url(owner, "console-observe"), **as_user(tmp_path, "olive")) as near,
        ):
            await echoes(relayed, b"before")
            assert await near.receive_bytes(timeout=5) == b"before"

            started = loop.time()
            draining = asyncio.create_task(owner.drain(cut_short=asyncio.Event()))
            ready = f"https://127.0.0.1:{owner.port}/readyz"
            async with http.get(ready, **as_user(tmp_path, "kubelet")) as answer:
                assert answer.status == 500
                assert "[-]shutdown failed" in await answer.text()

            # Within the delay: still a member everywhere, its Lease kept, both served.
            await echoes(relayed, b"during")
            assert await near.receive_bytes(timeout=5) == b"during"
            assert fake.lease("subres-system", lease) is not None
            assert owner.state.replica in other.state.owners.members
            assert loop.time() - started < DELAY, "the checks took the whole delay"

            ends = {}
            for name, ws in (("relayed", relayed), ("near", near)):
                closing = await ws.receive(timeout=DELAY + 10)
                ends[name] = (closing.type, closing.data, loop.time() - started)
            await asyncio.wait_for(draining, timeout=10)
        assert fake.lease("subres-system", lease) is None
        assert owner.state.replica not in other.state.owners.members
    for name, (kind, code, after) in ends.items():
        assert (kind, code) == (aiohttp.WSMsgType.CLOSE, 1001), (name, kind, code)
        assert after >= DELAY, f"{name} was told to leave {after:.2f} s into a {DELAY} s delay"
