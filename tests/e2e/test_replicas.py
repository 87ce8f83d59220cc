"""Two subres replicas behind a real kube-apiserver serve any client of any console or display.

Both run ``subres serve`` in cluster mode with the ServiceAccount that
``deploy/`` binds, each with its Pod as a kubelet would report it (Ready,
127.0.0.1, its own ``peer`` port) and its membership Lease. kube-apiserver
reaches replica A only: the APIService's ExternalName Service is one
address (``aggregation.py``). Replica B is reached the way kube-apiserver
reaches a replica, straight to its port with kube-apiserver's own
front-proxy certificate and ``X-Remote-*`` headers. Which replica owns a
unit is rendezvous hashing over the two names, so each test picks machine
names whose owner it wants. The settings are the defaults (membership
renewed every 2 s, counted for 6 s). The tests run in file order; the last
one kills a replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import os
import signal
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed, InvalidStatus

from subres.protocol import asciicast
from subres.sessions.members import LABELS, PREFIX, rendezvous
from subres.sessions.registry import SessionKey
from tests.e2e import subresserver
from tests.e2e.controlplane import ControlPlane, poll, run_sync
from tests.e2e.subresserver import SERVER_NAME, Profile, Subres
from tests.e2e.test_subres import (
    API,
    NS,
    USERS_GROUP,
    Route,
    console,
    direct,
    echoed,
    put_machine,
    refused,
    via_apiserver,
    vnc_display,
    wait_served,
)
from tests.support import LOOPBACK_POLICY, Backend

REPLICAS = ("replica-a", "replica-b")
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{subresserver.NAMESPACE}/leases"
CLOSE_TIMEOUT_S = 15.0
"""Bound on a close reaching the client of the other replica."""
FAILOVER_TIMEOUT_S = 30.0
"""Bound on waiting for a dead owner's console to be served again (the design's is 10 s:
`tests/bench/bench_replicas.py` measures it; a test only bounds its wait)."""
KEEP = {"subres.dev/keep-console": "true", "subres.dev/record-console": "true"}


@pytest.fixture(scope="module")
def replicas(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Subres, Subres]]:
    """Replica A (registered, Available) and replica B beside it, both members."""
    with replica_pair(control_plane, tmp_path_factory.mktemp("replicas")) as pair:
        yield pair


@contextlib.contextmanager
def replica_pair(
    plane: ControlPlane, workdir: Path | None = None
) -> Iterator[tuple[Subres, Subres]]:
    """Replicas A and B and their Pods, both members; alice's group bound to the user role.

    With `workdir`, both record consoles into one directory there (ReadWriteMany).
    """
    profile = Profile(args=("--replica-name=replica-a",))
    if workdir is not None:
        config = workdir / "config.yaml"
        recordings = {"directory": str(workdir / "recordings")}
        body = {"endpointPolicy": LOOPBACK_POLICY, "consoles": {"recordings": recordings}}
        config.write_text(yaml.safe_dump(body))
        profile = Profile(args=profile.args, config=config)
    a = run_sync(subresserver.launch(plane, profile))
    try:
        b = run_sync(subresserver.replica(a, "replica-b"))
        try:
            run_sync(subresserver.replica_pod(a, "replica-a"))
            run_sync(subresserver.replica_pod(b, "replica-b"))
            run_sync(bind_users(plane))
            for server in (a, b):
                assert run_sync(
                    poll(functools.partial(members, plane, server, 2), timeout_s=30.0)
                ), server.logs()
            yield a, b
        finally:
            run_sync(b.stop())
    finally:
        run_sync(plane.kubectl("delete", "pod", "-n", subresserver.NAMESPACE, *REPLICAS,
                               "--grace-period=0", "--force", "--wait=false"))  # fmt: skip
        run_sync(subresserver.shutdown(a))


async def bind_users(plane: ControlPlane) -> None:
    """The users group may use the subresources of Machines in NS (idempotent)."""
    await plane.ensure_namespace(NS)
    await plane.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "replica-users", "namespace": NS},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "subres-machine-user",
            },
            "subjects": [
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": USERS_GROUP}
            ],
        }
    )


def admin(plane: ControlPlane, server: Subres) -> dict[str, Any]:
    """aiohttp arguments to reach `server` straight, as kube-apiserver does for an admin."""
    return {
        "ssl": server.ssl_context(plane.front_proxy_client),
        "server_hostname": SERVER_NAME,
        "headers": {"X-Remote-User": "admin", "X-Remote-Group": "system:masters"},
    }


async def members(plane: ControlPlane, server: Subres, count: int) -> bool:
    """Whether `server` counts `count` members (its `subres_replica_members` gauge)."""
    try:
        async with (
            aiohttp.ClientSession() as http,
            http.get(server.url + "/metrics", **admin(plane, server)) as response,
        ):
            text = await response.text()
    except aiohttp.ClientError:
        return False
    return f"subres_replica_members {float(count)}" in text


def at_b(plane: ControlPlane, b: Subres, user: str) -> Route:
    """Straight to replica B as kube-apiserver's front proxy, for `user` of the users group."""
    headers = {"X-Remote-User": user, "X-Remote-Group": USERS_GROUP}
    return direct(b, plane.front_proxy_client, headers)


def owned_by(owner: str, sub: str, prefix: str) -> str:
    """A machine name whose `sub` the replica `owner` owns."""
    for number in range(100):
        name = f"{prefix}-{number}"
        if rendezvous(SessionKey("machines", sub, NS, name), REPLICAS) == owner:
            return name
    raise AssertionError("rendezvous hashing never picked the owner")


async def closed_with(ws: ClientConnection) -> tuple[int | None, str | None]:
    """Wait for the server to close `ws`; its close code and reason."""
    with pytest.raises(ConnectionClosed):
        async with asyncio.timeout(CLOSE_TIMEOUT_S):
            while True:
                await ws.recv()
    return ws.close_code, ws.close_reason


async def received(ws: ClientConnection, size: int) -> bytes:
    got = bytearray()
    async with asyncio.timeout(20):
        while len(got) < size:
            message = await ws.recv()
            assert isinstance(message, bytes)
            got += message
    return bytes(got)


async def full_frame(ws: ClientConnection) -> bytes:
    """An RFB 3.8 viewer's handshake (security None) and one full framebuffer update, as read."""
    got = bytearray()

    async def until(size: int) -> bytes:
        async with asyncio.timeout(20):
            while len(got) < size:
                message = await ws.recv()
                assert isinstance(message, bytes)
                got.extend(message)
        return bytes(got[:size])

    await until(12)
    await ws.send(b"RFB 003.008\n")
    await until(14)  # one security type: None
    await ws.send(b"\x01")
    await until(18)  # SecurityResult OK
    await ws.send(b"\x01")  # shared
    head = (await until(18 + 24))[18:]
    width, height = struct.unpack(">HH", head[:4])
    (name,) = struct.unpack(">I", head[20:24])
    await ws.send(b"\x03\x00" + struct.pack(">HHHH", 0, 0, width, height))
    return await until(18 + 24 + name + 16 + width * height * head[4] // 8)


async def test_an_observer_and_a_view_only_viewer_on_b_see_what_the_writer_on_a_sees(
    control_plane: ControlPlane, replicas: tuple[Subres, Subres], backend: Backend, tmp_path: Path
) -> None:
    _, b = replicas
    # The console is A's: B relays its observer there (the display is one replica's: the
    # other relays its viewer).
    name = owned_by("replica-a", "console", "rep-share")
    alice, bob = via_apiserver(control_plane, "alice"), at_b(control_plane, b, "bob")
    async with vnc_display(tmp_path / "vnc.sock") as (_, vnc_url):
        await put_machine(control_plane, name, console=backend.url, vnc=vnc_url)
        await wait_served(alice, name)
        await wait_served(bob, name)
        sent = os.urandom(1 << 20)
        async with (
            console(alice, name) as writer,
            console(bob, name, sub="console-observe") as observer,
        ):
            echoed_back, observed = await asyncio.gather(
                echoed(writer, sent), received(observer, len(sent))
            )
        digests = {hashlib.sha256(data).hexdigest() for data in (sent, echoed_back, observed)}
        assert len(digests) == 1
        async with (
            console(alice, name, sub="vnc") as viewer,
            console(bob, name, sub="vnc-observe") as watcher,
        ):
            seen, watched = await asyncio.gather(full_frame(viewer), full_frame(watcher))
        assert len(seen) > 1_000_000  # the whole 640x400 screen
        assert hashlib.sha256(seen).hexdigest() == hashlib.sha256(watched).hexdigest()


async def test_a_takeover_through_either_replica_ends_the_other_ones_session_with_4001(
    control_plane: ControlPlane, replicas: tuple[Subres, Subres], backend: Backend
) -> None:
    _, b = replicas
    name = owned_by("replica-a", "console", "rep-takeover")
    await put_machine(control_plane, name, console=backend.url)
    alice = via_apiserver(control_plane, "alice")
    bob = at_b(control_plane, b, "bob")
    await wait_served(alice, name)
    await wait_served(bob, name)

    async with console(alice, name) as first:
        assert await echoed(first, b"alice, through kube-apiserver to A") == (
            b"alice, through kube-apiserver to A"
        )
        async with console(bob, name) as second:
            assert await closed_with(first) == (4001, f"console of {NS}/{name} taken over by bob")
            assert await echoed(second, b"bob at B") == b"bob at B"
            # And back: through kube-apiserver (replica A), alice takes it from bob on B.
            async with console(alice, name) as third:
                assert await closed_with(second) == (
                    4001,
                    f"console of {NS}/{name} taken over by alice",
                )
                assert await echoed(third, b"mine again") == b"mine again"

    # Coordination is one Lease per replica, none per session: capped, naming its Pod.
    selector = ",".join(f"{k}={v}" for k, v in LABELS.items())
    answer = await control_plane.api("GET", LEASES, params={"labelSelector": selector})
    held = {i["metadata"]["name"]: i["spec"] for i in answer["items"]}
    assert set(held) == {PREFIX + r for r in REPLICAS}
    for lease, spec in held.items():
        assert spec["holderIdentity"] == lease.removeprefix(PREFIX)
        assert spec["leaseDurationSeconds"] == 6
    everything = await control_plane.api("GET", LEASES)
    assert len(everything["items"]) == len(REPLICAS)


async def test_preserve_session_is_refused_across_replicas(
    control_plane: ControlPlane, replicas: tuple[Subres, Subres], backend: Backend
) -> None:
    _, b = replicas
    name = owned_by("replica-b", "vnc", "rep-vnc")
    # A console too, only to tell when both replicas' caches have the Machine.
    await put_machine(control_plane, name, console=backend.url, vnc=backend.url)
    alice = via_apiserver(control_plane, "alice")
    await wait_served(alice, name)
    await wait_served(at_b(control_plane, b, "alice"), name)

    async with console(at_b(control_plane, b, "alice"), name, sub="vnc") as held:
        assert await echoed(held, b"rfb at B") == b"rfb at B"
        code, status = await refused(alice, name, sub="vnc", query="?preserveSession=true")
        assert code == 409, status
        assert (status["kind"], status["reason"]) == ("Status", "Conflict")
        assert "already has a vnc session" in status["message"]
        assert await echoed(held, b"still mine") == b"still mine"

    async def preserved() -> bool:
        try:
            async with console(alice, name, sub="vnc", query="?preserveSession=true") as ws:
                assert await echoed(ws, b"preserved") == b"preserved"
        except InvalidStatus as exc:
            assert exc.response.status_code == 409, exc
            return False
        return True

    assert await poll(preserved, timeout_s=10.0)


async def sessions(plane: ControlPlane, server: Subres) -> list[dict[str, Any]]:
    """The sessions in NS, asked of `server` straight."""
    where = f"{server.url}{API}/namespaces/{NS}/sessions"
    async with (
        aiohttp.ClientSession() as http,
        http.get(where, **admin(plane, server)) as response,
    ):
        assert response.status == 200, await response.text()
        assert "Warning" not in response.headers
        items: list[dict[str, Any]] = json.loads(await response.text())["items"]
        return items


async def test_the_sessions_list_is_complete_from_either_replica(
    control_plane: ControlPlane, replicas: tuple[Subres, Subres], backend: Backend
) -> None:
    a, b = replicas
    name = owned_by("replica-a", "console", "rep-list")
    await put_machine(control_plane, name, console=backend.url)
    alice, bob = via_apiserver(control_plane, "alice"), at_b(control_plane, b, "bob")
    await wait_served(alice, name)
    await wait_served(bob, name)
    async with (
        console(alice, name) as writer,
        console(bob, name, sub="console-observe") as observer,
    ):
        assert await echoed(writer, b"x" * 1000) == b"x" * 1000
        await received(observer, 1000)
        for asked in (a, b):
            mine = [i for i in await sessions(control_plane, asked) if i["parent"]["name"] == name]
            by_user = {i["user"]: i for i in mine}
            assert set(by_user) == {"alice", "bob"}
            assert (by_user["alice"]["replica"], by_user["bob"]["replica"]) == REPLICAS
            assert by_user["alice"]["bytesUp"] == by_user["alice"]["bytesDown"] == 1000
            assert by_user["bob"]["bytesDown"] == 1000
            assert all(i["clientAddress"] == "127.0.0.1" for i in mine)


async def recordings(plane: ControlPlane, server: Subres, name: str) -> list[dict[str, Any]]:
    where = f"{server.url}{API}/namespaces/{NS}/machines/{name}/recordings"
    async with (
        aiohttp.ClientSession() as http,
        http.get(where, **admin(plane, server)) as response,
    ):
        assert response.status == 200, await response.text()
        items: list[dict[str, Any]] = json.loads(await response.text())["items"]
        return items


async def recording(plane: ControlPlane, server: Subres, name: str, file: str) -> list[str]:
    """The markers of one recording, read through `server`."""
    where = f"{server.url}{API}/namespaces/{NS}/machines/{name}/recordings/{file}"
    async with (
        aiohttp.ClientSession() as http,
        http.get(where, **admin(plane, server)) as response,
    ):
        assert response.status == 200
        _, events = asciicast.read((await response.read()).splitlines())
        return [e.data for e in events if e.code == "m"]


async def test_a_kept_console_fails_over_when_its_owner_is_killed(
    control_plane: ControlPlane, replicas: tuple[Subres, Subres], backend: Backend
) -> None:
    a, b = replicas
    # B owns it: kill B, and A (which kube-apiserver reaches) keeps it then.
    name = owned_by("replica-b", "console", "rep-kept")
    alice = via_apiserver(control_plane, "alice")
    await put_machine(control_plane, name, console=backend.url, annotations=KEEP)
    async with asyncio.timeout(20), backend.changed:
        await backend.changed.wait_for(lambda: backend.open == 1)

    async def served() -> bool:
        try:
            async with console(alice, name, query="?tail=0") as ws:
                assert b"recorded" in await ws.recv()
        except InvalidStatus as exc:
            assert exc.response.status_code in (404, 503), exc  # not in A's cache yet
            return False
        return True

    assert await poll(served, timeout_s=20.0)
    accepted = backend.accepted
    async with console(alice, name, query="?tail=0") as writer:
        assert b"recorded" in await writer.recv()
        assert await echoed(writer, b"kept by B\r\n") == b"kept by B\r\n"
        assert b.process.popen is not None
        b.process.popen.send_signal(signal.SIGKILL)  # no drain: its Lease stays behind
        killed = time.monotonic()
        # A relayed alice to B: she is told to reconnect.
        code, _ = await closed_with(writer)
        assert code == 1001
    await b.stop()
    async with asyncio.timeout(FAILOVER_TIMEOUT_S), backend.changed:
        await backend.changed.wait_for(lambda: backend.accepted > accepted and backend.open == 1)
    failover_s = time.monotonic() - killed
    print(f"failover after SIGKILL: kept console dialled again after {failover_s:.1f}s")
    async with console(alice, name, query="?tail=0") as writer:
        assert b"recorded" in await writer.recv()
        assert await echoed(writer, b"kept by A\r\n") == b"kept by A\r\n"
    files = await recordings(control_plane, a, name)
    markers = [await recording(control_plane, a, name, f["name"]) for f in files]
    assert [
        "the replica replica-b that kept this console was lost; replica-a keeps it now",
        "alice (writer) attached",
    ] in [m[:2] for m in markers]
