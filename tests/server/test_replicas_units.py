"""USB slots, named consoles and console logs across replicas: each served by its unit's owner.

Two real cluster-mode replicas behind the fake apiserver
(`tests.server.replicas`); clients reach either, as kube-apiserver's Service
would pick one. Backends tag what they send back, so a client's bytes say
which slot or console answered.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from subres.server.run import Server
from tests.fakeapi import FakeApiServer
from tests.server.replicas import PATH, as_user, owner_and_other, replicas, url
from tests.server.test_consoles import TWO_CONSOLES, tagged
from tests.support import Backend, machine, wait_for

TIMEOUT = 10.0


@asynccontextmanager
async def tagged_backends(*tags: bytes) -> AsyncIterator[list[Backend]]:
    backends = [await Backend(handler=tagged(tag)).start_tcp() for tag in tags]
    try:
        yield backends
    finally:
        await asyncio.gather(*(b.stop() for b in backends))


async def put_vm(
    fake: FakeApiServer, servers: list[Server], status: dict[str, Any], **extra: Any
) -> None:
    """Machine `vm` with `status` added, once every replica's cache has it."""
    vm = machine("vm", status=status, **extra)
    await fake.put(vm)

    def seen(server: Server) -> bool:
        cached = server.state.caches["machines"].get("default", "vm")
        return cached is not None and all(cached["status"].get(k) == v for k, v in status.items())

    await wait_for(lambda: all(seen(s) for s in servers))


async def answer(ws: aiohttp.ClientWebSocketResponse, data: bytes) -> bytes:
    await ws.send_bytes(data)
    return await ws.receive_bytes(timeout=TIMEOUT)


async def test_usb_slots_are_chosen_by_their_owner_whichever_replica_a_client_reaches(
    tmp_path: Path, backend: Backend
) -> None:
    async with (
        tagged_backends(b"slot0:", b"slot1:") as slots,
        replicas(tmp_path, backend) as (fake, servers),
        aiohttp.ClientSession() as http,
    ):
        await put_vm(fake, servers, {"usbredir": {"endpoints": [b.url for b in slots]}})
        owner, other = owner_and_other(servers, "usbredir")
        async with (
            http.ws_connect(url(other, "usbredir"), **as_user(tmp_path, "alice")) as alice,
            http.ws_connect(url(owner, "usbredir"), **as_user(tmp_path, "bob")) as bob,
        ):
            assert await answer(alice, b"a") == b"slot0:a"
            assert await answer(bob, b"b") == b"slot1:b"
            async with http.ws_connect(
                url(other, "usbredir"), **as_user(tmp_path, "carol")
            ) as carol:
                closing = await alice.receive(timeout=TIMEOUT)
                assert (closing.type, closing.data, closing.extra) == (
                    aiohttp.WSMsgType.CLOSE,
                    4001,
                    "usbredir slot 0 of default/vm taken over by carol",
                )
                assert await answer(carol, b"c") == b"slot0:c"
            # The front that relayed alice and carol knows which slot each had.
            listing = await _get(http, tmp_path, other, "sessions")
            assert ("bob", "1") in {(i["user"], i["unit"]) for i in listing["items"]}
        assert not other.state.sessions.exclusive  # the owner alone holds slots
        await wait_for(lambda: not owner.state.sessions.exclusive)


async def test_a_named_console_is_relayed_to_its_own_owner(
    tmp_path: Path, backend: Backend
) -> None:
    async with (
        tagged_backends(b"[ttyS1]") as (serial1,),
        replicas(tmp_path, backend, config=lambda _: TWO_CONSOLES) as (fake, servers),
        aiohttp.ClientSession() as http,
    ):
        await put_vm(fake, servers, {"consoles": {"serial1": {"endpoint": serial1.url}}})
        for server in servers:
            async with http.ws_connect(
                url(server, "console", "?console=serial1"), **as_user(tmp_path, "alice")
            ) as ws:
                assert await answer(ws, b"hi") == b"[ttyS1]hi"
        assert serial1.accepted == 2 and backend.accepted == 0


async def test_a_console_log_is_followed_from_the_replica_that_keeps_it(
    tmp_path: Path, backend: Backend
) -> None:
    keep = {"subres.dev/keep-console": "true"}
    async with (
        tagged_backends(b"") as (serial0,),
        replicas(tmp_path, backend, annotations=keep) as (fake, servers),
        aiohttp.ClientSession() as http,
    ):
        await put_vm(fake, servers, {"console": {"endpoint": serial0.url}}, annotations=keep)
        owner, other = owner_and_other(servers)
        await serial0.wait_open(1)  # kept by its owner alone
        address = f"https://127.0.0.1:{other.port}{PATH}log?follow=true"
        async with http.get(address, **as_user(tmp_path, "alice")) as response:
            assert response.status == 200, await response.text()
            async with http.ws_connect(url(owner, "console"), **as_user(tmp_path, "bob")) as ws:
                await ws.send_bytes(b"typed on the owner\n")
                got = b""
                async with asyncio.timeout(TIMEOUT):
                    while not got.endswith(b"typed on the owner\n"):
                        got += await response.content.readany()
        assert serial0.accepted == 1


async def _get(http: aiohttp.ClientSession, tmp: Path, server: Server, sub: str) -> dict[str, Any]:
    address = f"https://127.0.0.1:{server.port}{PATH}{sub}"
    async with http.get(address, **as_user(tmp, "alice")) as response:
        assert response.status == 200, await response.text()
        body: dict[str, Any] = await response.json()
        return body
