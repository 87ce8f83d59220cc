"""Shared consoles behind a real kube-apiserver, with real RBAC, Events, kubectl and Leases.

Two replicas run as in ``test_replicas`` (A registered behind the
APIService, B reached straight with kube-apiserver's front-proxy
certificate). Bob is bound to ``subres-machine-observer`` only: he may
watch a console and may not type. The Events subres leaves on the Machine
are read back with ``kubectl describe``, the sessions with ``kubectl get``.
The last test kills the replica that keeps a console and sees the other one
take it over once the keeper's Lease expired.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Awaitable, Callable, Iterator

import pytest

from subres.sessions.leases import lease_name
from subres.sessions.registry import SessionKey
from tests.consoles import stdout_until
from tests.e2e.controlplane import ControlPlane, poll, run_sync
from tests.e2e.subresserver import GROUP, Subres
from tests.e2e.test_replicas import DURATION_S, LEASES, RENEW_S, at_b, replica_pair
from tests.e2e.test_subres import (
    NS,
    USERS_GROUP,
    Route,
    bind,
    console,
    echoed,
    put_machine,
    refused,
    via_apiserver,
    wait_served,
)
from tests.support import Backend

V5 = "v5.channel.k8s.io"
KEEP = {"subres.dev/keep-console": "true"}


@pytest.fixture(scope="module")
def replicas(control_plane: ControlPlane) -> Iterator[tuple[Subres, Subres]]:
    """Replicas A (registered) and B; alice may use consoles, bob may only watch."""
    with replica_pair(control_plane) as pair:
        run_sync(
            bind(
                control_plane,
                "bob-observes",
                subject="--user=bob",
                check_as=["--as=bob"],
                role="subres-machine-observer",
                subresource="console-observe",
            )
        )
        try:
            yield pair
        finally:
            # The other modules share the control plane: leave bob and NS as they were.
            run_sync(cleanup(control_plane))


async def cleanup(plane: ControlPlane) -> None:
    (await plane.kubectl("delete", "rolebinding", "bob-observes", "-n", NS)).check()
    for name in ("share-vm", "kept-vm"):
        await plane.kubectl("delete", "machine", name, "-n", NS, "--ignore-not-found")


async def can_i(plane: ControlPlane, user: str, subresource: str) -> str:
    answer = await plane.kubectl(
        "auth", "can-i", "get", f"machines.{GROUP}", f"--subresource={subresource}",
        "-n", NS, f"--as={user}",
    )  # fmt: skip
    return answer.stdout.strip()


async def test_an_observer_watches_without_typing_and_kubectl_shows_who_and_what(
    control_plane: ControlPlane, replicas: tuple[Subres, Subres], backend: Backend
) -> None:
    assert await can_i(control_plane, "bob", "console-observe") == "yes"
    assert await can_i(control_plane, "bob", "console") == "no"
    await put_machine(control_plane, "share-vm", console=backend.url)
    alice, bob = via_apiserver(control_plane, "alice"), via_apiserver(control_plane, "bob")
    await wait_served(alice, "share-vm")
    # kube-apiserver itself refuses bob the console: he may not type.
    code, _ = await refused(bob, "share-vm")
    assert code == 403
    async with (
        console(alice, "share-vm", subprotocols=[V5]) as writer,
        console(bob, "share-vm", subprotocols=[V5], sub="console-observe") as watcher,
    ):
        await watcher.send(b"\x00typed by bob\n")
        await writer.send(b"\x00hello from alice\n")
        await stdout_until(watcher, b"hello from alice\n")
        listed = await control_plane.kubectl(
            "get", f"sessions.{GROUP}", "-n", NS, "--as=alice", f"--as-group={USERS_GROUP}"
        )
        rows = [line.split() for line in listed.check().stdout.splitlines()[1:]]
        assert sorted(row[3:5] for row in rows if row[1] == "share-vm") == [
            ["observer", "bob"],
            ["writer", "alice"],
        ]
    assert backend.accepted >= 1

    async def described() -> bool:
        text = (await control_plane.kubectl("describe", "machine", "share-vm", "-n", NS)).stdout
        return all(
            words in text
            for words in (
                "ConsoleOpened",
                "Console opened by alice",
                "Console (read-only) opened by bob",
                "Console of alice closed after",
            )
        )

    assert await poll(described, timeout_s=20.0), replicas[0].logs()


async def test_the_keeper_moves_to_the_other_replica_when_its_holder_dies(
    control_plane: ControlPlane, replicas: tuple[Subres, Subres], backend: Backend
) -> None:
    a, b = replicas
    slot = lease_name(SessionKey("machines", "console-keeper", NS, "kept-vm"))
    await put_machine(control_plane, "kept-vm", console=backend.url, annotations=KEEP)

    async def holder() -> str:
        answer = await control_plane.kubectl("get", "--raw", f"{LEASES}/{slot}")
        if answer.returncode != 0:
            return ""
        return str(json.loads(answer.stdout)["spec"].get("holderIdentity") or "")

    assert await poll(lambda: holder_is(holder, "replica-"), timeout_s=30.0), a.logs()
    first = (await holder()).split("/")[0]
    dying, survivor = (a, b) if first == "replica-a" else (b, a)
    reach: Route = (
        at_b(control_plane, b, "alice") if survivor is b else via_apiserver(control_plane, "alice")
    )
    await backend.wait_open(1)
    accepted = backend.accepted

    assert dying.process.popen is not None
    dying.process.popen.send_signal(signal.SIGKILL)  # no drain: its Lease stays until it expires
    killed = time.monotonic()
    await dying.stop()
    other = "replica-b" if first == "replica-a" else "replica-a"
    moved = await poll(lambda: holder_is(holder, other), timeout_s=DURATION_S + RENEW_S + 30.0)
    assert moved, survivor.logs()
    assert time.monotonic() - killed >= DURATION_S - RENEW_S  # it waited for the expiry
    async with asyncio.timeout(20), backend.changed:
        await backend.changed.wait_for(lambda: backend.accepted > accepted and backend.open == 1)
    await wait_served(reach, "kept-vm")
    # The kept connection replays what went through it (wait_served's probe): ask for none.
    async with console(reach, "kept-vm", query="?tail=0") as ws:
        assert await echoed(ws, b"kept by the survivor") == b"kept by the survivor"
    assert backend.accepted == accepted + 1  # the survivor's writer used the kept connection


async def holder_is(holder: Callable[[], Awaitable[str]], prefix: str) -> bool:
    return (await holder()).startswith(prefix)
