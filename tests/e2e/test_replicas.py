"""Two subres replicas behind a real kube-apiserver agree through real Leases.

Both run ``subres serve`` in cluster mode with the ServiceAccount that
``deploy/`` grants Leases in ``subres-system``; both watch the Machines and
the session Leases. kube-apiserver reaches replica A only: the APIService's
ExternalName Service is one address (``aggregation.py``). Replica B is
reached the way kube-apiserver reaches a replica, straight to its port with
kube-apiserver's own front-proxy certificate and ``X-Remote-*`` headers, so
B authenticates and authorizes (SubjectAccessReview) exactly as A does.
What the replicas know of each other they learn only from the Leases.

Lease timings are shortened (6 s duration, renewed every 2 s) so that the
expiry of a killed replica's Lease is seen within the test. The tests run in
file order; the last one kills replica B.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed, InvalidStatus

from subres.sessions.leases import LABELS, USER_ANNOTATION, lease_name
from subres.sessions.registry import SessionKey
from tests.e2e import subresserver
from tests.e2e.controlplane import ControlPlane, poll, run_sync
from tests.e2e.subresserver import Profile, Subres
from tests.e2e.test_subres import (
    NS,
    USERS_GROUP,
    Route,
    console,
    direct,
    echoed,
    put_machine,
    refused,
    via_apiserver,
    wait_served,
)
from tests.support import Backend

DURATION_S, RENEW_S = 6, 2
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{subresserver.NAMESPACE}/leases"
CLOSE_TIMEOUT_S = 15.0
"""Bound on a takeover's close reaching the client of the other replica."""


@pytest.fixture(scope="module")
def replicas(control_plane: ControlPlane) -> Iterator[tuple[Subres, Subres]]:
    """Replica A (registered, Available) and replica B beside it; alice's group may use them."""
    with replica_pair(control_plane) as pair:
        yield pair


@contextlib.contextmanager
def replica_pair(control_plane: ControlPlane) -> Iterator[tuple[Subres, Subres]]:
    """Replicas A and B, their Leases short; alice's group bound to the user role."""
    flags = (
        f"--lease-duration={DURATION_S}s",
        f"--lease-renew-interval={RENEW_S}s",
        "--replica-name=replica-a",
    )
    a = run_sync(subresserver.launch(control_plane, Profile(args=flags)))
    try:
        b = run_sync(subresserver.replica(a, "replica-b"))
        try:
            run_sync(bind_users(control_plane))
            yield a, b
        finally:
            run_sync(b.stop())
    finally:
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


def at_b(plane: ControlPlane, b: Subres, user: str) -> Route:
    """Straight to replica B as kube-apiserver's front proxy, for `user` of the users group."""
    headers = {"X-Remote-User": user, "X-Remote-Group": USERS_GROUP}
    return direct(b, plane.front_proxy_client, headers)


async def lease(plane: ControlPlane, name: str, sub: str) -> dict[str, Any]:
    """The session Lease of Machine `name`'s `sub`, read as admin."""
    key = SessionKey("machines", sub, NS, name)
    answer: dict[str, Any] = await plane.api("GET", f"{LEASES}/{lease_name(key)}")
    return answer


async def closed_with(ws: ClientConnection) -> tuple[int | None, str | None]:
    """Wait for the server to close `ws`; its close code and reason."""
    with pytest.raises(ConnectionClosed):
        async with asyncio.timeout(CLOSE_TIMEOUT_S):
            while True:
                await ws.recv()
    return ws.close_code, ws.close_reason


async def test_a_takeover_through_either_replica_ends_the_other_ones_session_with_4001(
    control_plane: ControlPlane, replicas: tuple[Subres, Subres], backend: Backend
) -> None:
    _, b = replicas
    await put_machine(control_plane, "rep-console", console=backend.url)
    alice = via_apiserver(control_plane, "alice")
    bob = at_b(control_plane, b, "bob")
    await wait_served(alice, "rep-console")
    await wait_served(bob, "rep-console")

    async with console(alice, "rep-console") as first:
        assert await echoed(first, b"alice, through kube-apiserver to A") == (
            b"alice, through kube-apiserver to A"
        )
        async with console(bob, "rep-console") as second:
            assert await closed_with(first) == (
                4001,
                f"console of {NS}/rep-console taken over by bob",
            )
            assert await echoed(second, b"bob at B") == b"bob at B"
            held = await lease(control_plane, "rep-console", "console")
            assert held["spec"]["holderIdentity"].startswith("replica-b/")
            assert held["spec"]["leaseDurationSeconds"] == DURATION_S
            assert held["metadata"]["annotations"][USER_ANNOTATION] == "bob"
            assert LABELS.items() <= held["metadata"]["labels"].items()

            # And back: through kube-apiserver (replica A), alice takes it from bob on B.
            async with console(alice, "rep-console") as third:
                assert await closed_with(second) == (
                    4001,
                    f"console of {NS}/rep-console taken over by alice",
                )
                assert await echoed(third, b"mine again") == b"mine again"

    async def released() -> bool:
        answer = await control_plane.api("GET", LEASES, params={"labelSelector": _selector()})
        return not [i for i in answer["items"] if "rep-console" in i["metadata"]["name"]]

    assert await poll(released, timeout_s=10.0), "an ended session left its Lease behind"


async def test_preserve_session_is_refused_across_replicas(
    control_plane: ControlPlane, replicas: tuple[Subres, Subres], backend: Backend
) -> None:
    _, b = replicas
    # A console too, only to tell when both replicas' caches have the Machine.
    await put_machine(control_plane, "rep-vnc", console=backend.url, vnc=backend.url)
    alice = via_apiserver(control_plane, "alice")
    await wait_served(alice, "rep-vnc")
    await wait_served(at_b(control_plane, b, "alice"), "rep-vnc")

    async with console(at_b(control_plane, b, "alice"), "rep-vnc", sub="vnc") as held:
        assert await echoed(held, b"rfb at B") == b"rfb at B"
        code, status = await _refused_vnc(alice)
        assert code == 409, status
        assert (status["kind"], status["reason"]) == ("Status", "Conflict")
        assert "already has a vnc session" in status["message"]
        assert await echoed(held, b"still mine") == b"still mine"

    # B deleted its Lease when the session ended; A sees it through its watch.
    assert await poll(lambda: preserved(alice), timeout_s=10.0)


async def test_a_killed_replicas_lease_expires_and_then_a_new_session_succeeds(
    control_plane: ControlPlane, replicas: tuple[Subres, Subres], backend: Backend
) -> None:
    a, b = replicas
    alice = via_apiserver(control_plane, "alice")
    await put_machine(control_plane, "rep-vnc", console=backend.url, vnc=backend.url)
    await wait_served(alice, "rep-vnc")
    await wait_served(at_b(control_plane, b, "alice"), "rep-vnc")
    async with console(at_b(control_plane, b, "alice"), "rep-vnc", sub="vnc") as held:
        assert await echoed(held, b"about to die") == b"about to die"
        before = await lease(control_plane, "rep-vnc", "vnc")
        assert before["spec"]["holderIdentity"].startswith("replica-b/")

        assert b.process.popen is not None
        b.process.popen.send_signal(signal.SIGKILL)  # no drain, no Lease deleted
        killed = time.monotonic()
        await b.stop()

    # The Lease outlives its replica and blocks preserveSession, until it expires.
    code, status = await _refused_vnc(alice)
    assert code == 409, status
    blocked_s = time.monotonic() - killed

    assert await poll(lambda: preserved(alice), timeout_s=DURATION_S + RENEW_S + 20.0), a.logs()
    waited_s = time.monotonic() - killed
    # Nobody renewed it for a whole lease duration; then it no longer blocked anyone.
    assert blocked_s < waited_s
    assert waited_s >= DURATION_S - RENEW_S, waited_s


async def preserved(route: Route) -> bool:
    """Whether a vnc session asking `preserveSession=true` opens (and works); False on 409."""
    try:
        async with console(route, "rep-vnc", sub="vnc", query="?preserveSession=true") as ws:
            assert await echoed(ws, b"preserved") == b"preserved"
    except InvalidStatus as exc:
        assert exc.response.status_code == 409, exc
        return False
    return True


async def _refused_vnc(route: Route) -> tuple[int, dict[str, Any]]:
    return await refused(route, "rep-vnc", sub="vnc", query="?preserveSession=true")


def _selector() -> str:
    return ",".join(f"{k}={v}" for k, v in LABELS.items())
