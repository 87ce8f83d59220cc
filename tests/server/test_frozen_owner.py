"""A front's dial of a frozen owner is abandoned the moment the owner leaves the members.

Two real replicas (`tests.server.replicas`) and a third member, "frozen":
its Lease and Ready Pod are in the fake apiserver, and its peer port accepts
TCP connections and never answers (a process stopped, or a node gone quiet,
looks so). It owns `vm`'s console. A client asks for the console through
replica A: A dials the frozen owner, and the dial hangs. When the frozen
member's Lease goes, A must give up that dial at once and serve the client
through the console's new owner, not wait out `session.connectTimeout`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp

from subres.sessions.members import LABELS, PREFIX, rendezvous
from tests.server.replicas import as_user, echoes, pod, replicas, unit, url
from tests.support import Backend, wait_for

CONNECT_TIMEOUT = 30.0
"""The replicas' `session.connectTimeout`: what a dial not abandoned would wait."""
ABANDONED_WITHIN = 5.0
"""Bound on the client being served once the frozen owner left (the watch, a dial, a 101)."""


@asynccontextmanager
async def _silent_listener() -> AsyncIterator[tuple[int, asyncio.Event]]:
    """A port that accepts connections and never says a word; the event is set at the first."""
    accepted = asyncio.Event()
    writers: list[asyncio.StreamWriter] = []

    async def hold(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        accepted.set()

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    try:
        yield int(server.sockets[0].getsockname()[1]), accepted
    finally:
        server.close()
        for writer in writers:
            writer.close()
        await server.wait_closed()


def _lease(holder: str) -> dict[str, object]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": PREFIX + holder, "namespace": "subres-system", "labels": LABELS},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 60},
    }


async def test_a_dial_of_an_owner_that_leaves_the_members_is_abandoned_at_once(
    tmp_path: Path, backend: Backend
) -> None:
    settings = {"session": {"connectTimeout": CONNECT_TIMEOUT}}
    names = ("replica-a", "replica-b")
    frozen = next(
        f"replica-{i}"
        for i in range(100)
        if rendezvous(unit(), (*names, f"replica-{i}")) == f"replica-{i}"
    )
    loop = asyncio.get_running_loop()
    async with (
        # A long member duration: the frozen member, which never renews, counts until removed.
        replicas(
            tmp_path, backend, config=lambda _: settings, member_duration=60.0, member_renew=1.0
        ) as (fake, servers),
        _silent_listener() as (port, accepted),
        aiohttp.ClientSession() as http,
    ):
        front = servers[0]
        await fake.put_pod(pod(frozen, port))
        await fake.put_lease(_lease(frozen))
        await wait_for(lambda: all(frozen in s.state.owners.members for s in servers))
        assert front.state.owners.owner(unit()) == frozen

        opening = asyncio.create_task(
            http.ws_connect(url(front, "console"), **as_user(tmp_path, "alice"))
        )
        async with asyncio.timeout(10):
            await accepted.wait()  # the front is dialing the frozen owner
        left = loop.time()
        await fake.remove_lease("subres-system", PREFIX + frozen)
        async with asyncio.timeout(ABANDONED_WITHIN):
            ws = await opening
        served_after = loop.time() - left
        async with ws:
            await echoes(ws, b"served by the new owner")
    print(f"  served {served_after:.2f} s after the frozen owner left")
    assert served_after < ABANDONED_WITHIN
