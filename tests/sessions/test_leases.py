"""Session Leases between replicas, against a fake apiserver that keeps Leases as kube does.

Each "replica" is a `Sessions` registry over its own `SessionLeases` and its
own apiserver client, sharing only the fake apiserver: what one replica
learns of another it learns from Lease writes, reads and the watch.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from subres.kube import client
from subres.kube.informer import InformerSettings
from subres.kube.status import StatusError
from subres.sessions.leases import LABELS, USER_ANNOTATION, LeaseSettings, SessionLeases, lease_name
from subres.sessions.registry import Busy, SessionKey, Sessions
from tests.fakeapi import FakeApiServer, start_fake
from tests.support import wait_for

NS = "subres-system"
KEY = SessionKey("machines", "console", "default", "vm1")
VNC = SessionKey("machines", "vnc", "default", "vm1")
FAST = InformerSettings(backoff_initial=0.01, backoff_max=0.05)
SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
LABEL = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", fullmatch=True)


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass(eq=False)
class Client:
    """A session's client: remembers how it was closed."""

    closed: asyncio.Future[tuple[int, str]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )

    async def close(self, code: int = 1000, reason: str = "") -> None:
        if not self.closed.done():
            self.closed.set_result((code, reason))

    def drop(self) -> None:
        raise AssertionError("only a shutdown drops sessions")

    async def close_reason(self) -> tuple[int, str]:
        async with asyncio.timeout(5):
            return await asyncio.shield(self.closed)


@dataclass
class Replica:
    """One replica's view: its registry and its Leases."""

    name: str
    sessions: Sessions
    leases: SessionLeases

    async def open(self, key: SessionKey, user: str, *, preserve: bool = False) -> Client:
        """Claim `key` for `user` and start a session on it."""
        claim = await self.sessions.claim(key, user=user, preserve=preserve)
        session = Client()
        self.sessions.start(claim, session)
        return session

    def end(self, key: SessionKey) -> None:
        """End the session this replica holds on `key`."""
        claim = self.sessions.exclusive[key]
        assert claim.session is not None
        self.sessions.end(claim, claim.session)
        self.sessions.release(claim)


@contextlib.asynccontextmanager
async def replica(
    fake: FakeApiServer,
    name: str,
    *,
    watching: bool = True,
    duration: int = 30,
    renew_interval: float = 1000.0,
    clock: Callable[[], float] | None = None,
) -> AsyncIterator[Replica]:
    """A replica named `name`; `watching=False` leaves its watch off (a lagging replica)."""
    api = await client.connect(fake.kubeconfig())
    settings = LeaseSettings(NS, name, duration=duration, renew_interval=renew_interval)
    leases = SessionLeases(api, settings, informer=FAST, clock=clock or Clock())
    if watching:
        await leases.start()
        await wait_for(lambda: leases.synced)
    try:
        yield Replica(name, Sessions(shared=leases), leases)
    finally:
        await leases.stop(grace=5)
        await api.close()


@contextlib.asynccontextmanager
async def pair(
    tmp: Path, *, a: dict[str, Any] | None = None, b: dict[str, Any] | None = None
) -> AsyncIterator[tuple[FakeApiServer, Replica, Replica]]:
    """A fake apiserver and replicas `replica-a` and `replica-b` (with `a`'s, `b`'s options)."""
    async with (
        start_fake(tmp) as fake,
        replica(fake, "replica-a", **(a or {})) as first,
        replica(fake, "replica-b", **(b or {})) as second,
    ):
        yield fake, first, second


def stored(fake: FakeApiServer, key: SessionKey = KEY) -> dict[str, Any]:
    lease = fake.lease(NS, lease_name(key))
    assert lease is not None, f"no lease for {key}"
    return lease


def holder(fake: FakeApiServer, key: SessionKey = KEY) -> str:
    """The replica half of the Lease's holder identity."""
    return str(stored(fake, key)["spec"]["holderIdentity"]).split("/")[0]


def user(fake: FakeApiServer, key: SessionKey = KEY) -> str:
    return str(stored(fake, key)["metadata"]["annotations"][USER_ANNOTATION])


# --- names ----------------------------------------------------------------------------------


def test_lease_names_are_readable_when_they_fit() -> None:
    name = lease_name(KEY)
    assert name.startswith("console.machines.default.vm1-")
    assert name != lease_name(VNC) != lease_name(SessionKey("hosts", "console", "default", "vm1"))


@given(
    resource=LABEL,
    namespace=LABEL,
    name=st.lists(LABEL, min_size=1, max_size=8).map(".".join).filter(lambda n: len(n) <= 253),
    other=LABEL,
)
def test_lease_names_are_valid_and_distinct(
    resource: str, namespace: str, name: str, other: str
) -> None:
    key = SessionKey(resource, "console", namespace, name)
    made = lease_name(key)
    assert len(made) <= 253 and SUBDOMAIN.fullmatch(made), made
    assert made != lease_name(SessionKey(resource, "console", namespace, name + other))
    assert made != lease_name(SessionKey(resource, "vnc", namespace, name))


def test_a_hostile_name_still_makes_a_valid_lease_name() -> None:
    made = lease_name(SessionKey("machines", "console", "ns", "A_B/..//" + "x" * 400))
    assert len(made) <= 253 and SUBDOMAIN.fullmatch(made), made


# --- across replicas ------------------------------------------------------------------------


async def test_a_takeover_on_another_replica_closes_the_session_naming_the_user(
    tmp_path: Path,
) -> None:
    async with pair(tmp_path) as (fake, a, b):
        first = await a.open(KEY, "alice")
        lease = stored(fake)
        assert lease["spec"]["holderIdentity"].startswith("replica-a/")
        await wait_for(lambda: b.sessions.active(KEY))

        second = await b.open(KEY, "bob")
        assert await first.close_reason() == (4001, "console of default/vm1 taken over by bob")
        assert not second.closed.done()
        assert KEY not in a.sessions.exclusive and KEY in b.sessions.exclusive

        lease = stored(fake)
        spec, meta = lease["spec"], lease["metadata"]
        assert spec["holderIdentity"].startswith("replica-b/")
        assert spec["leaseTransitions"] == 1
        assert spec["leaseDurationSeconds"] == 30
        assert meta["annotations"][USER_ANNOTATION] == "bob"
        assert meta["annotations"]["subres.dev/name"] == "vm1"
        assert LABELS.items() <= meta["labels"].items()
        # The other slots of the machine are untouched.
        assert fake.lease(NS, lease_name(VNC)) is None


async def test_a_takeover_on_the_same_replica_closes_at_once(tmp_path: Path) -> None:
    async with start_fake(tmp_path) as fake, replica(fake, "replica-a") as a:
        first = await a.open(KEY, "alice")
        second = await a.open(KEY, "bob")
        assert await first.close_reason() == (4001, "console of default/vm1 taken over by bob")
        assert not second.closed.done()
        assert a.sessions.exclusive[KEY].session is second


async def test_preserve_is_refused_across_replicas_while_the_lease_is_fresh(
    tmp_path: Path,
) -> None:
    async with (
        start_fake(tmp_path) as fake,
        replica(fake, "replica-a") as a,
        replica(fake, "replica-b") as b,
        replica(fake, "replica-c", watching=False) as lagging,
    ):
        held = await a.open(VNC, "alice")
        await wait_for(lambda: b.sessions.active(VNC))
        writes = fake.calls["lease:create"] + fake.calls["lease:replace"]
        with pytest.raises(Busy):
            await b.sessions.claim(VNC, user="bob", preserve=True)
        # A replica whose watch has not seen the Lease learns it from its write.
        with pytest.raises(Busy):
            await lagging.sessions.claim(VNC, user="carol", preserve=True)
        assert fake.calls["lease:create"] + fake.calls["lease:replace"] == writes + 1
        assert user(fake, VNC) == "alice"
        assert not held.closed.done()

        a.end(VNC)
        await wait_for(lambda: fake.lease(NS, lease_name(VNC)) is None)
        await wait_for(lambda: not b.sessions.active(VNC))
        kept = await b.open(VNC, "bob", preserve=True)
        assert user(fake, VNC) == "bob"
        assert not kept.closed.done()


async def test_a_lease_nobody_renews_stops_blocking_after_its_duration(tmp_path: Path) -> None:
    clock = Clock()
    # replica-a never renews within the test: to the others it is a replica that died.
    async with pair(tmp_path, a={"duration": 30}, b={"clock": clock}) as (fake, dead, b):
        await dead.open(VNC, "alice")
        await wait_for(lambda: b.sessions.active(VNC))
        clock.now += 29.5
        with pytest.raises(Busy):
            await b.sessions.claim(VNC, user="bob", preserve=True)
        clock.now += 1
        assert not b.sessions.active(VNC)
        await b.open(VNC, "bob", preserve=True)
        assert holder(fake, VNC) == "replica-b"


async def test_a_renewal_keeps_the_lease_fresh_for_the_others(tmp_path: Path) -> None:
    clock = Clock()
    async with pair(tmp_path, a={"renew_interval": 0.05}, b={"clock": clock}) as (fake, a, b):
        await a.open(VNC, "alice")
        first = stored(fake, VNC)["metadata"]["resourceVersion"]
        await wait_for(lambda: fake.calls["lease:replace"] >= 3)
        renewed = stored(fake, VNC)
        assert renewed["metadata"]["resourceVersion"] != first
        assert renewed["spec"]["holderIdentity"].startswith("replica-a/")
        # Each renewal is news to replica-b: it counts from when it saw the latest one.
        clock.now += 100
        version = renewed["metadata"]["resourceVersion"]
        await wait_for(lambda: stored(fake, VNC)["metadata"]["resourceVersion"] != version)
        await wait_for(lambda: b.sessions.active(VNC))
        with pytest.raises(Busy):
            await b.sessions.claim(VNC, user="bob", preserve=True)


async def test_a_replica_that_missed_the_takeover_learns_it_when_it_renews(
    tmp_path: Path,
) -> None:
    async with pair(tmp_path, a={"watching": False, "renew_interval": 0.05}) as (fake, deaf, b):
        first = await deaf.open(KEY, "alice")
        await b.open(KEY, "bob")
        assert await first.close_reason() == (4001, "console of default/vm1 taken over by bob")
        assert holder(fake) == "replica-b"


async def test_ending_deletes_only_a_lease_still_ones_own(tmp_path: Path) -> None:
    async with pair(tmp_path) as (fake, a, b):
        await a.open(KEY, "alice")
        a.end(KEY)
        await wait_for(lambda: fake.lease(NS, lease_name(KEY)) is None)

        first = await a.open(KEY, "alice")
        await b.open(KEY, "bob")
        await first.close_reason()
        claim = next(iter(a.sessions.exclusive.values()), None)
        assert claim is None  # taken: nothing left to release on replica-a
        deletes = fake.calls["lease:delete"]
        await a.leases.stop(grace=5)
        assert fake.calls["lease:delete"] == deletes
        assert user(fake) == "bob"


async def test_stopping_deletes_the_leases_of_live_sessions(tmp_path: Path) -> None:
    async with start_fake(tmp_path) as fake, replica(fake, "replica-a") as a:
        await a.open(KEY, "alice")
        await a.open(VNC, "alice")
        await a.leases.stop(grace=5)
        assert fake.leases.objects == {}


async def test_expired_leases_of_dead_replicas_are_swept(tmp_path: Path) -> None:
    clock = Clock()
    short = {"duration": 1}
    async with pair(tmp_path, a=short, b={**short, "clock": clock}) as (fake, dead, b):
        await dead.open(KEY, "alice")
        await wait_for(lambda: b.sessions.active(KEY))
        clock.now += 2
        # replica-b sweeps every lease duration (1 s here) of its own.
        await wait_for(lambda: fake.lease(NS, lease_name(KEY)) is None)


async def test_a_failed_lease_write_is_a_503_naming_the_reason(tmp_path: Path) -> None:
    async with start_fake(tmp_path) as fake, replica(fake, "replica-a") as a:
        fake.lease_error = 403
        with pytest.raises(StatusError) as caught:
            await a.sessions.claim(KEY, user="alice")
        assert caught.value.code == 503
        assert "cannot coordinate the console of default/vm1" in caught.value.message
        assert "leases is forbidden" in caught.value.message
        assert not a.sessions.exclusive


async def test_taken_over_before_it_started_closes_as_soon_as_it_starts(
    tmp_path: Path,
) -> None:
    async with pair(tmp_path) as (_, a, b):
        claim = await a.sessions.claim(KEY, user="alice")
        await b.open(KEY, "bob")
        await wait_for(lambda: claim.lost is not None)
        late = Client()
        a.sessions.start(claim, late)
        assert await late.close_reason() == (4001, "console of default/vm1 taken over by bob")
        a.sessions.end(claim, late)
        a.sessions.release(claim)
