"""Who owns a unit: rendezvous hashing, and which Leases make a replica a member.

The membership's view is fed the way its watches feed it (listings and
changes of Leases and Pods) with a clock the test moves; nothing here needs
an apiserver. Forged Leases (anyone who may write Leases in subres's
namespace) count only for a Ready replica Pod, and never longer than
`--member-duration`.
"""

from __future__ import annotations

from typing import Any, cast

from subres.kube import client
from subres.sessions.members import PREFIX, Membership, MembershipSettings, Owners, rendezvous
from subres.sessions.registry import SessionKey
from tests.server.replicas import pod

UNITS = [SessionKey("machines", "console", "default", f"vm{i}") for i in range(2000)]


def lease(holder: str, *, name: str = "", duration: int = 6, version: str = "1") -> dict[str, Any]:
    return {
        "metadata": {"name": name or PREFIX + holder, "resourceVersion": version},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": duration},
    }


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Api:
    """The Lease calls a membership makes; `down` makes them fail as an unreachable apiserver."""

    def __init__(self) -> None:
        self.down = False
        self.version = 0

    async def create_lease(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._stored(body)

    async def replace_lease(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._stored(body)

    def _stored(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.down:
            raise OSError("connection refused")
        self.version += 1
        return body | {"metadata": body["metadata"] | {"resourceVersion": str(self.version)}}


def membership(clock: Clock, me: str = "a", api: Api | None = None) -> Membership:
    settings = MembershipSettings(
        namespace="subres-system",
        replica=me,
        selector="app.kubernetes.io/name=subres",
        peer_port=8445,
        duration=6.0,
        renew=2.0,
    )
    # The watches are fed by hand; only this replica's own Lease is written.
    return Membership(cast(client.Api, api or Api()), settings, Owners(me), clock=clock)


def members(view: Membership) -> tuple[str, ...]:
    return view.owners.members


def test_a_member_leaving_moves_only_its_own_units_and_spreads_them() -> None:
    before = {u: rendezvous(u, ["a", "b", "c"]) for u in UNITS}
    after = {u: rendezvous(u, ["a", "c"]) for u in UNITS}
    moved = [u for u in UNITS if before[u] != after[u]]
    assert moved and all(before[u] == "b" for u in moved)
    assert {after[u] for u in moved} == {"a", "c"}
    counts = [list(before.values()).count(m) for m in "abc"]
    assert min(counts) > len(UNITS) / 3 * 0.8


async def test_a_lease_counts_only_for_a_ready_replica_pod_of_its_name() -> None:
    clock = Clock()
    view = membership(clock)
    view.listed(1, [pod("a", 9000), pod("b", 9001), pod("c", 9002, ready=False)])
    view.listed(
        0,
        [
            lease("a"),
            lease("b"),
            lease("c"),  # its Pod is not Ready
            lease("mallory"),  # no Pod at all
            lease("b", name=PREFIX + "x"),  # a Lease whose name is not its holder's
        ],
    )
    assert members(view) == ("a", "b")
    assert view.owners.addresses["b"] == ("127.0.0.1", 9001)


async def test_a_forged_lease_counts_no_longer_than_the_member_duration() -> None:
    clock = Clock()
    view = membership(clock)
    view.listed(1, [pod("a", 9000), pod("b", 9001)])
    view.listed(0, [lease("a"), lease("b", duration=2**31 - 1)])
    assert members(view) == ("a", "b")
    clock.now += 5.9
    view.changed(0, lease("a", version="2"), deleted=False)  # a renews; b does not
    assert members(view) == ("a", "b")
    clock.now += 0.2
    view.changed(0, lease("a", version="3"), deleted=False)
    assert members(view) == ("a",)
    assert view.owners.lost == {"b"}  # it did not leave: its Lease is still there


async def test_a_draining_member_stays_one_until_its_lease_goes() -> None:
    """Its Pod being deleted and then not Ready is the drain: its units move when it deletes
    its Lease, after its shutdown delay, not when the deletion is seen."""
    clock = Clock()
    view = membership(clock)
    view.listed(1, [pod("a", 9000), pod("b", 9001)])
    view.listed(0, [lease("a"), lease("b")])
    deleting = pod("b", 9001)
    deleting["metadata"]["deletionTimestamp"] = "2026-12-06T05:00:00Z"
    view.changed(1, deleting, deleted=False)
    deleting["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    view.changed(1, deleting, deleted=False)
    view.listed(1, [pod("a", 9000), deleting])  # a relist in the meantime
    assert members(view) == ("a", "b")
    assert view.owners.addresses["b"] == ("127.0.0.1", 9001)
    view.changed(0, lease("b"), deleted=True)
    assert members(view) == ("a",)
    assert view.owners.lost == frozenset()
    # A Pod first seen being deleted never was a member here: it does not become one.
    late = membership(clock)
    late.listed(1, [pod("a", 9000), deleting])
    late.listed(0, [lease("a"), lease("b")])
    assert members(late) == ("a",)


async def test_a_deleted_lease_left_and_a_replica_outside_any_pod_counts_itself() -> None:
    clock = Clock()
    view = membership(clock, me="laptop")
    view.listed(1, [pod("b", 9001)])
    view.listed(0, [lease("laptop"), lease("b")])
    assert members(view) == ("b", "laptop")
    view.changed(0, lease("b"), deleted=True)
    assert members(view) == ("laptop",)
    assert view.owners.lost == frozenset()
    assert view.owners.owner(UNITS[0]) == "laptop"


async def test_an_unreachable_apiserver_freezes_the_view_instead_of_emptying_it() -> None:
    clock, api = Clock(), Api()
    view = membership(clock, api=api)
    view.listed(1, [pod("a", 9000), pod("b", 9001)])
    view.listed(0, [lease("b")])
    await view.renew()
    assert view.synced and members(view) == ("a", "b")
    api.down = True
    for _ in range(10):  # a minute of failed renewals; b's Lease is not seen renewed either
        clock.now += 6
        await view.renew()
        view.changed(0, lease("a", version="1"), deleted=False)
    assert members(view) == ("a", "b")
    api.down = False
    await view.renew()  # back: nobody could renew meanwhile, so b gets a member duration
    view.changed(0, lease("a", version="99"), deleted=False)
    assert members(view) == ("a", "b")
    for _ in range(2):
        clock.now += 2.5
        await view.renew()
        assert members(view) == ("a", "b")
    clock.now += 1.5  # b, which really stopped renewing, expires a member duration on
    await view.renew()
    assert members(view) == ("a",)
    assert view.owners.lost == frozenset({"b"})


async def test_after_an_outage_a_live_peer_renewing_a_moment_later_never_drops_out() -> None:
    clock, api = Clock(), Api()
    view = membership(clock, api=api)
    view.listed(1, [pod("a", 9000), pod("b", 9001)])
    view.listed(0, [lease("b")])
    await view.renew()
    moves: list[tuple[str, ...]] = []
    view.owners.on_change(moves.append)
    api.down = True
    for _ in range(5):
        clock.now += 6
        await view.renew()
    api.down = False
    await view.renew()  # a renews first...
    clock.now += 1.5
    view.changed(0, lease("b", version="2"), deleted=False)  # ...b a moment later
    assert members(view) == ("a", "b")
    assert moves == []


def test_leaving_is_told_once_when_the_member_goes_and_never_after_the_block() -> None:
    owners = Owners("a", ("a", "b"))
    told: list[str] = []
    with owners.leaving("b", lambda: told.append("b")):
        owners.update(["a", "b"], {})
        assert told == []
        owners.update(["a"], {})
        owners.update(["a", "c"], {})
    with owners.leaving("c", lambda: told.append("c")):
        pass
    owners.update(["a"], {})
    with owners.leaving("gone", lambda: told.append("gone")):
        pass
    assert told == ["b", "gone"]
