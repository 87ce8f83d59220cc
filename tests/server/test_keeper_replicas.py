"""A kept, recorded console across replicas: its owner keeps and records it, any replica serves it.

Two real cluster-mode replicas (`tests.server.replicas`), each with its own
recordings directory. The machine opts in to a kept and recorded console;
only its owner dials it, writers and observers on the other replica share
that one connection, and the recording the owner writes is listed and read
through either replica. When the owner goes, the other keeps the console:
cleanly (its Lease deleted) or lost (its Pod no longer Ready), which the next
recording says.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp

from subres.protocol import asciicast
from subres.server.run import Server
from tests.server.replicas import (
    PATH,
    as_user,
    echoes,
    owner_and_other,
    pod,
    replicas,
    url,
)
from tests.support import Backend, machine, wait_for

OPT_IN = {"subres.dev/keep-console": "true", "subres.dev/record-console": "true"}


def keeping(server: Server) -> bool:
    return server.state.metrics.registry.get_sample_value("subres_consoles_kept") == 1


def recording_config(tmp: Path) -> Any:
    def config(replica: str) -> dict[str, Any]:
        return {"consoles": {"recordings": {"directory": str(tmp / f"recordings-{replica}")}}}

    return config


async def get(http: aiohttp.ClientSession, tmp: Path, server: Server, path: str) -> bytes:
    where = f"https://127.0.0.1:{server.port}{PATH}{path}"
    async with http.get(where, **as_user(tmp, "auditor")) as r:
        assert r.status == 200, await r.text()
        assert "Warning" not in r.headers
        return await r.read()


async def test_the_owner_keeps_and_records_and_either_replica_serves_both(
    tmp_path: Path, backend: Backend
) -> None:
    async with (
        replicas(tmp_path, backend, config=recording_config(tmp_path), annotations=OPT_IN) as (
            _,
            servers,
        ),
        aiohttp.ClientSession() as http,
    ):
        owner, other = owner_and_other(servers)
        await wait_for(lambda: keeping(owner))
        await backend.wait_open(1)
        assert not keeping(other)
        async with http.ws_connect(url(other, "console"), **as_user(tmp_path, "alice")) as ws:
            banner = await ws.receive_bytes(timeout=5)
            assert b"this console session is recorded" in banner
            await echoes(ws, b"kept\r\n")
        async with http.ws_connect(
            url(other, "console", "?tail=1"), **as_user(tmp_path, "bob")
        ) as ws:
            replayed = b""
            while b"kept" not in replayed:
                replayed += await ws.receive_bytes(timeout=5)
        assert backend.accepted == 1  # every writer shared the owner's kept connection
        for asked in (other, owner):
            items = json.loads(await get(http, tmp_path, asked, "recordings"))["items"]
            assert len(items) == 2
        recorded = {}
        for item in items:
            body = await get(http, tmp_path, other, f"recordings/{item['name']}")
            _, events = asciicast.read(body.splitlines())
            seen = [(e.code, e.data) for e in events]
            first = next(data for code, data in seen if code == "m")
            recorded[first] = "".join(data for code, data in seen if code == "o")
        via = other.state.replica
        assert set(recorded) == {
            f"alice (writer, via {via}) attached",
            f"bob (writer, via {via}) attached",
        }
        assert "kept\r\n" in recorded[f"alice (writer, via {via}) attached"]


async def test_when_the_owner_stops_the_other_replica_keeps_the_console(
    tmp_path: Path, backend: Backend
) -> None:
    async with (
        replicas(tmp_path, backend, annotations=OPT_IN) as (_, servers),
        aiohttp.ClientSession() as http,
    ):
        owner, other = owner_and_other(servers)
        await wait_for(lambda: keeping(owner))
        async with http.ws_connect(url(owner, "console"), **as_user(tmp_path, "alice")) as ws:
            await echoes(ws, b"before")
            await owner.stop()
            closing = await ws.receive(timeout=5)
            assert closing.type == aiohttp.WSMsgType.CLOSE
            assert closing.data == 1001
        await wait_for(lambda: keeping(other))
        await backend.wait_open(1)
        async with http.ws_connect(url(other, "console"), **as_user(tmp_path, "bob")) as ws:
            await echoes(ws, b"kept elsewhere")


async def test_a_lost_owner_is_marked_in_the_next_recording(
    tmp_path: Path, backend: Backend
) -> None:
    async with (
        replicas(tmp_path, backend, config=recording_config(tmp_path), annotations=OPT_IN) as (
            fake,
            servers,
        ),
        aiohttp.ClientSession() as http,
    ):
        owner, other = owner_and_other(servers)
        await wait_for(lambda: keeping(owner))
        # The kubelet reports the owner's Pod not Ready (its node is lost, say): its
        # Lease is still there, so it did not leave; it was lost.
        await fake.put_pod(pod(owner.state.replica, owner.peer_port, ready=False))
        await wait_for(lambda: keeping(other))
        async with http.ws_connect(url(other, "console"), **as_user(tmp_path, "bob")) as ws:
            assert b"recorded" in await ws.receive_bytes(timeout=5)
            await echoes(ws, b"after\r\n")
        items = json.loads(await get(http, tmp_path, other, "recordings"))["items"]
        (item,) = items
        body = await get(http, tmp_path, owner, f"recordings/{item['name']}")
        _, events = asciicast.read(body.splitlines())
        markers = [e.data for e in events if e.code == "m"]
        assert markers[0] == (
            f"the replica {owner.state.replica} that kept this console was lost; "
            f"{other.state.replica} keeps it now"
        )


async def test_tail_is_warned_about_only_when_the_owner_keeps_no_scrollback(
    tmp_path: Path, backend: Backend
) -> None:
    async with (
        replicas(tmp_path, backend, annotations=OPT_IN) as (fake, servers),
        aiohttp.ClientSession() as http,
    ):
        owner, other = owner_and_other(servers)
        await wait_for(lambda: keeping(owner))
        where = url(other, "console-observe", "?tail=5")
        async with http.ws_connect(where, **as_user(tmp_path, "olive")) as ws:
            assert "Warning" not in ws._response.headers
        vm = machine("vm", console=backend.url)  # no longer opts in: let go
        vm["status"]["vnc"] = {"endpoint": backend.url}
        await fake.put(vm)
        await wait_for(lambda: not keeping(owner))
        async with http.ws_connect(where, **as_user(tmp_path, "olive")) as ws:
            assert "is not kept, so it has no scrollback" in ws._response.headers["Warning"]
