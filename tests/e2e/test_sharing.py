"""Shared consoles behind a real kube-apiserver, with real RBAC, Events and kubectl.

Two replicas run as in ``test_replicas`` (A registered behind the
APIService, B reached straight with kube-apiserver's front-proxy
certificate). Bob is bound to ``subres-machine-observer`` only: he may
watch a console and may not type. The Events subres leaves on the Machine
are read back with ``kubectl describe``, the sessions with ``kubectl get``.
(A kept console across replicas and its failover: ``test_replicas``.)
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.consoles import stdout_until
from tests.e2e.controlplane import ControlPlane, poll, run_sync
from tests.e2e.subresserver import GROUP, Subres
from tests.e2e.test_replicas import replica_pair
from tests.e2e.test_subres import (
    NS,
    USERS_GROUP,
    bind,
    console,
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
