"""Which replica owns each unit: replica membership and rendezvous hashing.

Every shared unit (a console, a display: `registry.SessionKey`) has one
owner, the member with the highest `sha256(member ‖ unit)`. Every replica
computes it from its own view of the members; a change of members moves only
the units of the replica that came or went.

`Owners` is that view. Standalone it is this replica alone. In cluster mode
`Membership` feeds it (see `docs/replicas.md`):

- Each replica holds one `coordination.k8s.io/v1` Lease in subres's
  namespace, `subres-replica-<pod>`, renewed every `renew` seconds, and
  deletes it when its drain's shutdown delay is over.
- A replica is a member while its Lease is fresh *and* names, as holder, a
  Pod that subres knows: in its namespace, selected as a replica, Ready, with
  an address, not being deleted. A member whose Pod is being deleted stays
  one, Ready or not, until its Lease goes: it is draining (not ready on
  purpose, serving until endpoints dropped it), and its units move when it
  says so, not when the deletion is seen. The Pod gives the peer address. (A replica
  that runs outside any Pod, beside a cluster, counts itself alone.) A Lease's
  duration counts only up to `duration` (a forged Lease cannot hold longer),
  and freshness is judged on the local clock from when this replica first
  saw the Lease's current version (as client-go's leader election does).
- While this replica's own renewals fail, it expires nobody: an apiserver
  that cannot be reached freezes the view instead of emptying it (it stops
  expiring others a renewal and a half after its own last one, before any
  peer's Lease, renewed as often, could expire). Nobody could renew
  meanwhile, so once its own renewal succeeds again every Lease is judged
  from that moment: a peer that died during the outage expires a member
  duration later, and live ones are not dropped (their units moved away and
  back, every session on them reconnecting twice) for renewing a moment
  after this one.
- A member that drops out while its Lease was still there (expired, or its
  Pod stopped being Ready) was *lost*: its units' new owners mark their
  recordings so.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import hashlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from subres.kube import client
from subres.kube.client import ApiError
from subres.kube.informer import Informer, InformerSettings
from subres.sessions.registry import SessionKey

__all__ = ["LABELS", "PREFIX", "Membership", "MembershipSettings", "Owners", "rendezvous"]

log = logging.getLogger(__name__)

LABELS = {"app.kubernetes.io/name": "subres", "app.kubernetes.io/component": "replica"}
"""Every membership Lease carries these; the watch selects by them."""
PREFIX = "subres-replica-"
"""A membership Lease's name is this and its holder's Pod name."""
PEER_PORT_NAME = "peer"
"""The container port, in a replica's Pod, where it serves the other replicas."""


def rendezvous(unit: SessionKey, members: Iterable[str]) -> str | None:
    """The member with the highest `sha256(member ‖ unit)`; None without members."""
    hashed = unit.hashed()
    return max(
        members,
        key=lambda member: hashlib.sha256(member.encode() + b"\0" + hashed).digest(),
        default=None,
    )


@dataclass
class Owners:
    """This replica's view of the members, their addresses, and who owns what."""

    replica: str
    """This replica's name (its Pod's)."""
    members: tuple[str, ...] = ()
    """The members, sorted; standalone, this replica alone."""
    addresses: Mapping[str, tuple[str, int]] = field(default_factory=dict)
    """Each member's peer address (host, port)."""
    lost: frozenset[str] = frozenset()
    """Members that dropped out without deleting their Lease (they died)."""
    settled: bool = True
    """False for one renewal after this replica joined: the units it wins are let go
    by their old owners first, before it keeps their consoles."""
    _listeners: list[Callable[[tuple[str, ...]], None]] = field(default_factory=list)

    @classmethod
    def alone(cls, replica: str) -> Owners:
        """A replica without others: it owns everything."""
        return cls(replica, (replica,))

    def owner(self, unit: SessionKey) -> str | None:
        """The member that owns `unit`; None while there is none."""
        return rendezvous(unit, self.members)

    def mine(self, unit: SessionKey) -> bool:
        """True when this replica owns `unit`."""
        return self.owner(unit) == self.replica

    def others(self) -> list[str]:
        """The members other than this replica."""
        return [m for m in self.members if m != self.replica]

    def on_change(self, listener: Callable[[tuple[str, ...]], None]) -> None:
        """Call `listener(previous members)` after every change of members."""
        self._listeners.append(listener)

    @contextlib.contextmanager
    def leaving(self, member: str, then: Callable[[], object]) -> Iterator[None]:
        """Within the block, call `then()` once as soon as `member` is no longer a member
        (at once if it is not one)."""

        def changed(_: tuple[str, ...]) -> None:
            if member not in self.members and changed in self._listeners:
                self._listeners.remove(changed)
                then()

        self._listeners.append(changed)
        try:
            changed(self.members)
            yield
        finally:
            if changed in self._listeners:
                self._listeners.remove(changed)

    def settle(self) -> None:
        """This replica has been a member long enough to keep consoles: tell the listeners."""
        self.settled = True
        for listener in list(self._listeners):
            listener(self.members)

    def update(
        self,
        members: Iterable[str],
        addresses: Mapping[str, tuple[str, int]],
        *,
        lost: Iterable[str] = (),
    ) -> None:
        """A new view; listeners hear of it when the members changed."""
        previous = self.members
        self.members = tuple(sorted(members))
        self.addresses = dict(addresses)
        self.lost = (self.lost | frozenset(lost)) - frozenset(self.members)
        if self.members != previous:
            log.info("replicas: %s", ", ".join(self.members) or "none")
            for listener in list(self._listeners):
                listener(previous)


@dataclass(frozen=True)
class MembershipSettings:
    """Where membership Leases live, how often they are renewed and how long they count."""

    namespace: str
    replica: str
    """This replica's Pod name."""
    selector: str
    """The label selector of the replica Pods."""
    peer_port: int
    """The peer port of a replica Pod that names no `peer` container port."""
    duration: float = 6.0
    renew: float = 2.0


@dataclass
class _Seen:
    obj: Mapping[str, Any]
    version: str
    at: float
    """The local clock when this replica first saw this version."""


class Membership:
    """Writes this replica's Lease and watches every replica's Lease and Pod into `Owners`."""

    def __init__(
        self,
        api: client.Api,
        settings: MembershipSettings,
        owners: Owners,
        *,
        informer: InformerSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.settings = settings
        self.owners = owners
        self.clock = clock
        self.synced = False
        """True once the Leases and the Pods were listed and this replica's Lease written."""
        self._leases: dict[str, _Seen] = {}
        self._pods: dict[str, tuple[str, int] | None] = {}
        """Every replica Pod by name: its peer address, or None while it cannot serve."""
        self._listed = [False, False]
        self._version = ""
        self._renewed: float | None = None
        """When this replica's last renewal succeeded (local clock)."""
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        selector = ",".join(f"{k}={v}" for k, v in LABELS.items())
        namespace = settings.namespace
        self._informers = (
            Informer(
                source=client.Leases(api, namespace, selector),
                sink=_Sink(self, 0),
                name=f"replica leases in {namespace}",
                settings=informer,
            ),
            Informer(
                source=client.Pods(api, namespace, settings.selector),
                sink=_Sink(self, 1),
                name=f"{namespace}/pods {settings.selector}",
                settings=informer,
            ),
        )

    @property
    def name(self) -> str:
        """This replica's Lease."""
        return PREFIX + self.settings.replica

    async def start(self) -> None:
        """Watch, and renew this replica's Lease."""
        self._tasks = [asyncio.create_task(i.run(), name=i.name) for i in self._informers]
        self._tasks.append(asyncio.create_task(self._run(), name="replica membership"))

    async def stop(self, *, grace: float) -> None:
        """Stop renewing, delete this replica's Lease (at most `grace`), stop watching."""
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks)
        version, self._version = self._version, ""
        if version:
            with contextlib.suppress(ApiError, TimeoutError, OSError):
                async with asyncio.timeout(max(grace, 0.1)):
                    await self.api.delete_lease(
                        self.settings.namespace, self.name, resource_version=version
                    )

    async def leave(self) -> None:
        """Drain: delete this replica's Lease now, so that its units move at once."""
        if self._tasks:
            self._tasks[-1].cancel()  # the renewals
        version, self._version = self._version, ""
        if version:
            with contextlib.suppress(ApiError, OSError):
                await self.api.delete_lease(
                    self.settings.namespace, self.name, resource_version=version
                )

    # --- the watches -----------------------------------------------------------------------

    def listed(self, which: int, objects: Iterable[Mapping[str, Any]]) -> None:
        """A complete listing of Leases (0) or Pods (1)."""
        if which == 0:
            listed = {_name(obj): obj for obj in objects}
            for name in set(self._leases) - set(listed):
                del self._leases[name]
            for obj in listed.values():
                self._lease(obj)
        else:
            previous, self._pods = self._pods, {}
            for obj in objects:
                self._pod(obj, previous)
        self._listed[which] = True
        self._recompute()

    def changed(self, which: int, obj: Mapping[str, Any], *, deleted: bool) -> None:
        """One Lease (0) or Pod (1) was written or deleted."""
        if which == 0:
            if deleted:
                self._leases.pop(_name(obj), None)
            else:
                self._lease(obj)
        elif deleted:
            self._pods.pop(_name(obj), None)
        else:
            self._pod(obj, self._pods)
        self._recompute(deleted=_name(obj) if deleted and which == 0 else "")

    def _lease(self, obj: Mapping[str, Any]) -> None:
        name, version = _name(obj), _version(obj)
        seen = self._leases.get(name)
        if seen is None or seen.version != version:
            self._leases[name] = _Seen(obj, version, self.clock())

    def _pod(self, obj: Mapping[str, Any], previous: Mapping[str, tuple[str, int] | None]) -> None:
        name = _name(obj)
        address = _address(obj, self.settings.peer_port)
        if address is None and (obj.get("metadata") or {}).get("deletionTimestamp"):
            # Draining: it serves where it did until its Lease goes (or expires).
            address = previous.get(name)
        self._pods[name] = address

    # --- the view --------------------------------------------------------------------------

    def _fresh(self, seen: _Seen) -> bool:
        spec = seen.obj.get("spec") or {}
        declared = spec.get("leaseDurationSeconds")
        duration = self.settings.duration
        if isinstance(declared, int) and not isinstance(declared, bool):
            duration = min(duration, float(declared))  # capped: a forged Lease cannot hold longer
        return self.clock() - seen.at < duration

    def _frozen(self) -> bool:
        """This replica missed a renewal: keep the view rather than expire the others.

        Its peers renew as often as it does, so their Leases, as seen here,
        expire no sooner than `duration - renew` after its own last renewal:
        later than the renewal and a half after which it stops expiring anyone.
        """
        if self._renewed is None:
            return True
        return self.clock() - self._renewed > 1.5 * self.settings.renew

    def _recompute(self, *, deleted: str = "") -> None:
        if not all(self._listed):
            return
        frozen = self._frozen() and self.synced
        members: dict[str, tuple[str, int]] = {}
        me = self.settings.replica
        for name, seen in self._leases.items():
            holder = str((seen.obj.get("spec") or {}).get("holderIdentity") or "")
            address = self._pods.get(holder)
            # This replica outside any Pod (beside a cluster, in tests) counts itself: no one
            # else can reach it, and it need not reach itself.
            if holder == me and me not in self._pods:
                address = ("", 0)
            if name != PREFIX + holder or address is None:
                continue
            if (frozen and holder in self.owners.members) or self._fresh(seen):
                members[holder] = address
        gone = set(self.owners.members) - set(members)
        left = {deleted.removeprefix(PREFIX)} if deleted else set()
        if me in members and me not in self.owners.members and len(members) > 1:
            self.owners.settled = False
            asyncio.get_running_loop().call_later(self.settings.renew, self._settle)
        self.owners.update(members, members, lost=gone - left)

    def _settle(self) -> None:
        self.owners.settle()

    def next_expiry(self) -> float:
        """Seconds until the next fresh Lease would expire (at most one renewal away)."""
        soonest = self.settings.renew
        for seen in self._leases.values():
            if self._fresh(seen):
                spec = seen.obj.get("spec") or {}
                declared = spec.get("leaseDurationSeconds")
                duration = self.settings.duration
                if isinstance(declared, int) and not isinstance(declared, bool):
                    duration = min(duration, float(declared))
                soonest = min(soonest, seen.at + duration - self.clock())
        return max(soonest, 0.05)

    # --- this replica's Lease --------------------------------------------------------------

    async def _run(self) -> None:
        due = self.clock()
        while True:
            if self.clock() >= due:
                await self.renew()
                due = self.clock() + self.settings.renew
            self._recompute()
            # Wakes for the next renewal or the next expiry, whichever comes first.
            await asyncio.sleep(min(due - self.clock(), self.next_expiry()))

    async def renew(self) -> None:
        """Renew this replica's Lease once (a failure is logged; the view freezes)."""
        thawing = self.synced and self._frozen()
        try:
            stored = await self._write()
        except (ApiError, OSError, TimeoutError) as exc:
            log.warning("cannot renew this replica's Lease %s: %s", self.name, exc)
            return
        self._version = _version(stored)
        self._renewed = self.clock()
        if thawing:
            for seen in self._leases.values():
                seen.at = max(seen.at, self._renewed)
        self._lease(stored)
        if not self.synced and all(self._listed):
            self.synced = True
        self._recompute()

    async def _write(self) -> Mapping[str, Any]:
        namespace = self.settings.namespace
        if self._version:
            try:
                return await self.api.replace_lease(namespace, self._body(self._version))
            except ApiError as exc:
                if exc.status not in (404, 409):
                    raise
        try:
            return await self.api.create_lease(namespace, self._body(""))
        except ApiError as exc:
            if exc.status != 409:
                raise
        current = await self.api.read_lease(namespace, self.name)
        return await self.api.replace_lease(namespace, self._body(_version(current)))

    def _body(self, version: str) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "name": self.name,
            "namespace": self.settings.namespace,
            "labels": dict(LABELS),
        }
        if version:
            meta["resourceVersion"] = version
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": {
                "holderIdentity": self.settings.replica,
                "leaseDurationSeconds": max(1, round(self.settings.duration)),
                "renewTime": now,
            },
        }


class _Sink:
    """The informer's `Sink` for the Leases (0) or the Pods (1)."""

    def __init__(self, membership: Membership, which: int) -> None:
        self._membership = membership
        self._which = which

    def replace(self, objects: Iterable[Mapping[str, Any]]) -> None:
        """A complete listing."""
        self._membership.listed(self._which, objects)

    def upsert(self, obj: Mapping[str, Any]) -> None:
        """An object was written."""
        self._membership.changed(self._which, obj, deleted=False)

    def delete(self, obj: Mapping[str, Any]) -> None:
        """An object was deleted."""
        self._membership.changed(self._which, obj, deleted=True)


def _address(pod: Mapping[str, Any], default_port: int) -> tuple[str, int] | None:
    """The peer address of a replica Pod that can serve now, else None."""
    meta, spec, status = (pod.get(k) or {} for k in ("metadata", "spec", "status"))
    ip = status.get("podIP")
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or ()
    )
    if meta.get("deletionTimestamp") or not ip or not ready:
        return None
    for container in spec.get("containers") or ():
        for port in container.get("ports") or ():
            if port.get("name") == PEER_PORT_NAME and isinstance(port.get("containerPort"), int):
                return str(ip), int(port["containerPort"])
    return str(ip), default_port


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def _version(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")
