"""Session Leases: exclusive console and vnc slots that hold across replicas.

Cluster mode's `Shared` lock for `Sessions`. Each slot (parent resource,
subresource, namespace, name) is one `coordination.k8s.io/v1` Lease in
subres's own namespace, named by `lease_name`, labelled as a session Lease
and annotated with what it is for and the user holding it. Its holder
identity is `<replica>/<session id>`.

- Claiming creates the Lease, or replaces it on the condition that it is
  still at the resourceVersion last seen (a conflict re-reads and tries
  again): a takeover. A claim that preserves refuses instead while the Lease
  is fresh.
- Fresh means: less than the Lease's `leaseDurationSeconds` ago, this replica
  first saw its current resourceVersion. Only the local monotonic clock is
  used (as client-go's leader election does), so the replicas' wall clocks
  never need to agree; a replica that just started treats every Lease it
  finds as renewed when it found it.
- The holder replaces its Lease every `renew_interval` on the same
  condition (one renewing task per replica, not one per session). A
  conflict re-reads it: another holder means the session was taken over,
  and it ends.
- Every replica watches the session Leases (`Informer`). Once it has seen one
  of its own writes of a Lease, any later version naming another holder
  means that session was taken over: `Sessions.taken_over` closes it with
  4001, naming the user from the Lease's annotation. Watch events arrive in
  order, so a version older than its own write is never mistaken for a
  takeover.
- A session that ends deletes its Lease on the condition that it is still
  its own. A replica that dies leaves its Leases to expire: once stale they
  block nobody, and any replica deletes them (on the same condition).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import hashlib
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from subres.kube import client
from subres.kube.client import ApiError
from subres.kube.informer import Informer, InformerSettings
from subres.kube.status import StatusError
from subres.sessions.registry import Busy, Claim, SessionKey

__all__ = ["LABELS", "USER_ANNOTATION", "LeaseSettings", "SessionLeases", "lease_name"]

log = logging.getLogger(__name__)

JSON = dict[str, Any]

LABELS = {"app.kubernetes.io/name": "subres", "app.kubernetes.io/component": "session"}
"""Every session Lease carries these; the watch selects by them."""
USER_ANNOTATION = "subres.dev/user"
"""The user whose session holds the Lease: named to the session it takes over."""
ATTEMPTS = 4
"""Writes tried against a Lease that keeps changing before giving up."""
NAME_LIMIT = 253
_INVALID = re.compile(r"[^a-z0-9-]+")


@dataclass(frozen=True)
class LeaseSettings:
    """Where session Leases live and how long they hold."""

    namespace: str
    """subres's own namespace."""
    identity: str
    """This replica (its pod name): the first half of every holder identity it writes."""
    duration: int = 30
    """`leaseDurationSeconds`: how long a Lease nobody renews blocks `preserveSession`."""
    renew_interval: float = 10.0
    """Seconds between renewals of a live session's Lease."""


def lease_name(key: SessionKey) -> str:
    """`console.machines.ns.vm1-<hash>`: readable, unique, within Kubernetes name limits.

    The hash of the whole key keeps two keys apart even when the readable
    part had to be shortened or cleaned.
    """
    whole = "\0".join((key.resource, key.subresource, key.namespace, key.name))
    digest = hashlib.sha256(whole.encode()).hexdigest()[:12]
    parts = f"{key.subresource}.{key.resource}.{key.namespace}.{key.name}".lower().split(".")
    labels = (_INVALID.sub("-", part).strip("-") for part in parts)
    readable = ".".join(label for label in labels if label)
    readable = readable[: NAME_LIMIT - len(digest) - 1].strip(".-")
    return f"{readable}-{digest}" if readable else digest


@dataclass(eq=False)
class _Held:
    """A claim of this replica on one Lease."""

    # (A plain record: only its shape resembles other dataclasses' field lists.)

    claim: Claim
    name: str
    holder: str
    version: str = ""
    """resourceVersion of our last write; empty when the Lease must be created."""
    acquired: str = ""
    transitions: int = 0
    confirmed: bool = False
    """The watch has shown one of our writes: later versions are newer than it."""
    lost: bool = False
    due: float = 0.0
    """When (event loop time) the next renewal is due."""


@dataclass
class _Seen:
    obj: Mapping[str, Any]
    version: str
    at: float
    """The local clock when this replica first saw this version."""


class SessionLeases:
    """Session slots shared through Leases (a `Shared` lock); also the watch's `Sink`."""

    def __init__(
        self,
        api: client.Api,
        settings: LeaseSettings,
        *,
        informer: InformerSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.settings = settings
        self.clock = clock
        self.synced = False
        """True once the first listing of session Leases arrived."""
        self._seen: dict[str, _Seen] = {}
        self._mine: dict[str, _Held] = {}
        self._incoming: dict[str, _Held] = {}
        self._notify: Callable[[Claim, str], None] = lambda claim, by: None
        self._background: set[asyncio.Task[None]] = set()
        self._renewals = asyncio.Event()
        """Set when a Lease was added to those to renew."""
        self._renewer: asyncio.Task[None] | None = None
        self._runners: list[asyncio.Task[None]] = []
        selector = ",".join(f"{k}={v}" for k, v in LABELS.items())
        self._informer = Informer(
            source=client.Leases(api, settings.namespace, selector),
            sink=self,
            name=f"session leases in {settings.namespace}",
            settings=informer,
        )

    # --- Shared ----------------------------------------------------------------------------

    def on_taken_over(self, notify: Callable[[Claim, str], None]) -> None:
        """Call `notify(claim, user)` when another replica's session took `claim`'s slot."""
        self._notify = notify

    def holders(self) -> list[Mapping[str, Any]]:
        """The session Leases with a fresh holder, as last seen (every replica's)."""
        return [seen.obj for seen in self._seen.values() if self._fresh(seen)]

    def held(self, key: SessionKey) -> bool:
        """True while the Lease of `key` has a holder and is fresh, as last seen."""
        seen = self._seen.get(lease_name(key))
        return seen is not None and self._fresh(seen)

    async def acquire(self, claim: Claim, *, preserve: bool) -> None:
        """Write the Lease for `claim` (see the module docstring); `Busy` or 503 otherwise."""
        name = lease_name(claim.key)
        held = _Held(claim, name, holder=f"{self.settings.identity}/{claim.id}")
        self._incoming[name] = held
        try:
            await self._take(held, preserve=preserve)
        except ApiError as exc:
            raise StatusError(
                503, f"cannot coordinate the {claim.key} with other replicas: {exc}"
            ) from None
        finally:
            del self._incoming[name]
        self._mine.pop(name, None)  # a session of this replica that `claim` took over
        if held.lost:
            return
        held.due = asyncio.get_running_loop().time() + self.settings.renew_interval
        self._mine[name] = held
        self._renewals.set()
        if self._renewer is None:  # the first Lease this replica holds
            self._renewer = asyncio.create_task(self._renew(), name="renew session leases")
            self._runners.append(self._renewer)

    def release(self, claim: Claim) -> None:
        """Delete `claim`'s Lease in the background, unless it was taken since."""
        name = lease_name(claim.key)
        held = self._mine.get(name)
        if held is None or held.claim is not claim:
            return
        del self._mine[name]
        self._spawn(self._delete(held), name=f"release {name}")

    # --- running ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Start watching the Leases and sweeping expired ones."""
        self._runners += [
            asyncio.create_task(self._informer.run(), name=self._informer.name),
            asyncio.create_task(self._sweep(), name="sweep session leases"),
        ]

    async def stop(self, *, grace: float) -> None:
        """Delete the Leases still held (waiting at most `grace` seconds), stop watching."""
        for held in list(self._mine.values()):
            self.release(held.claim)
        if self._background:
            await asyncio.wait(self._background, timeout=grace)
        for task in (*self._runners, *self._background):
            task.cancel()
        pending = (*self._runners, *self._background)
        if pending:
            await asyncio.wait(pending)

    # --- the watch (Sink) ------------------------------------------------------------------

    def replace(self, objects: Iterable[Mapping[str, Any]]) -> None:
        """A complete listing."""
        listed = {_name(obj): obj for obj in objects}
        for name in set(self._seen) - set(listed):
            del self._seen[name]
        for obj in listed.values():
            self._observe(obj)
        for name in {*self._mine, *self._incoming}:
            self._check(name, listed.get(name))
        self.synced = True

    def upsert(self, obj: Mapping[str, Any]) -> None:
        """A Lease was created or written."""
        self._observe(obj)
        self._check(_name(obj), obj)

    def delete(self, obj: Mapping[str, Any]) -> None:
        """A Lease was deleted."""
        self._seen.pop(_name(obj), None)
        self._check(_name(obj), None)

    # --- inside ----------------------------------------------------------------------------

    async def _take(self, held: _Held, *, preserve: bool) -> None:
        seen = self._seen.get(held.name)
        current = seen.obj if seen is not None else None
        for _ in range(ATTEMPTS):
            try:
                if current is None:
                    held.version, held.transitions = "", 0
                    stored = await self.api.create_lease(self.settings.namespace, self._body(held))
                else:
                    if preserve and self._fresh(self._observe(current)):
                        raise Busy(held.claim.key)
                    held.version = _version(current)
                    held.transitions = _spec(current).get("leaseTransitions", 0) + 1
                    stored = await self.api.replace_lease(self.settings.namespace, self._body(held))
            except ApiError as exc:
                if exc.status not in (404, 409):
                    raise
                current = await self._read(held.name)
                continue
            self._stored(held, stored)
            return
        raise StatusError(
            503, f"the lease of the {held.claim.key} keeps changing; try again", reason="Conflict"
        )

    async def _renew(self) -> None:
        """Renew each held Lease when it is due, sleeping until the next one is."""
        loop = asyncio.get_running_loop()
        while True:
            due = [h for h in self._mine.values() if h.due <= loop.time()]
            await asyncio.gather(*(self._renew_one(h) for h in due))
            self._renewals.clear()
            wake = min((h.due for h in self._mine.values()), default=None)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(wake):
                    await self._renewals.wait()

    async def _renew_one(self, held: _Held) -> None:
        try:
            await self._renew_once(held)
        except ApiError as exc:
            # Keep the session: the next renewal, or the watch, tells whether it was taken.
            log.warning("renewing lease %s: %s", held.name, exc)
        held.due = asyncio.get_running_loop().time() + self.settings.renew_interval

    async def _renew_once(self, held: _Held) -> None:
        for _ in range(ATTEMPTS):
            if self._mine.get(held.name) is not held:
                return  # released or taken while renewing: never write it again
            try:
                body = self._body(held)
                if held.version:
                    stored = await self.api.replace_lease(self.settings.namespace, body)
                else:
                    stored = await self.api.create_lease(self.settings.namespace, body)
            except ApiError as exc:
                if exc.status not in (404, 409):
                    raise
            else:
                self._stored(held, stored)
                return
            current = await self._read(held.name)
            if current is None:
                held.version = ""  # deleted while we could not renew it: create it again
            elif _holder(current) != held.holder:
                self._lose(held, current)
                return
            else:
                held.version = _version(current)

    async def _delete(self, held: _Held) -> None:
        with contextlib.suppress(ApiError):
            for _ in range(ATTEMPTS):
                try:
                    await self.api.delete_lease(
                        self.settings.namespace, held.name, resource_version=held.version
                    )
                except ApiError as exc:
                    if exc.status != 409:
                        return
                else:
                    self._forget(held.name, held.version)
                    return
                # Renewed as we stopped renewing it, or taken: delete only our own.
                current = await self._read(held.name)
                if current is None or _holder(current) != held.holder:
                    return
                held.version = _version(current)

    async def _sweep(self) -> None:
        """Delete Leases that nobody renewed for their duration (their replica died)."""
        while True:
            await asyncio.sleep(self.settings.duration)
            for name, seen in list(self._seen.items()):
                if name in self._mine or name in self._incoming or self._fresh(seen):
                    continue
                try:
                    await self.api.delete_lease(
                        self.settings.namespace, name, resource_version=seen.version
                    )
                except ApiError:
                    continue  # renewed after all, taken, or gone: nothing to sweep
                self._forget(name, seen.version)
                log.info("deleted expired lease %s of %s", name, _holder(seen.obj))

    async def _read(self, name: str) -> Mapping[str, Any] | None:
        try:
            current = await self.api.read_lease(self.settings.namespace, name)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        self._observe(current)
        return current

    def _forget(self, name: str, version: str) -> None:
        """A Lease we deleted: no longer holds anything, before the watch says so."""
        seen = self._seen.get(name)
        if seen is not None and seen.version == version:
            del self._seen[name]

    def _stored(self, held: _Held, stored: Mapping[str, Any]) -> None:
        held.version = _version(stored)
        self._observe(stored)

    def _check(self, name: str, obj: Mapping[str, Any] | None) -> None:
        """Whether a version of Lease `name` (None: deleted) shows a session of ours taken over."""
        for held in (self._incoming.get(name), self._mine.get(name)):
            if held is None:
                continue
            if obj is None:
                held.confirmed = False  # the next renewal creates it again, or finds the taker
            elif _holder(obj) == held.holder:
                held.confirmed = True
            elif held.confirmed:
                self._lose(held, obj)

    def _lose(self, held: _Held, taker: Mapping[str, Any]) -> None:
        if held.lost:
            return
        held.lost = True
        if self._mine.get(held.name) is held:
            del self._mine[held.name]
        user = _annotations(taker).get(USER_ANNOTATION) or _holder(taker) or "another session"
        log.info("lease %s taken by %s (%s)", held.name, _holder(taker), user)
        self._notify(held.claim, user)

    def _observe(self, obj: Mapping[str, Any]) -> _Seen:
        name, version = _name(obj), _version(obj)
        seen = self._seen.get(name)
        if seen is None or seen.version != version:
            seen = _Seen(obj, version, self.clock())
            self._seen[name] = seen
        return seen

    def _fresh(self, seen: _Seen) -> bool:
        spec = _spec(seen.obj)
        duration = spec.get("leaseDurationSeconds") or self.settings.duration
        return bool(spec.get("holderIdentity")) and self.clock() - seen.at < duration

    def _body(self, held: _Held) -> JSON:
        key = held.claim.key
        now = _micro_time()
        held.acquired = held.acquired or now
        metadata: JSON = {
            "name": held.name,
            "namespace": self.settings.namespace,
            "labels": {**LABELS, "subres.dev/subresource": key.subresource},
            "annotations": {
                USER_ANNOTATION: held.claim.user,
                "subres.dev/resource": key.resource,
                "subres.dev/subresource": key.subresource,
                "subres.dev/namespace": key.namespace,
                "subres.dev/name": key.name,
            },
        }
        if held.version:
            metadata["resourceVersion"] = held.version
        spec = {
            "holderIdentity": held.holder,
            "leaseDurationSeconds": self.settings.duration,
            "acquireTime": held.acquired,
            "renewTime": now,
            "leaseTransitions": held.transitions,
        }
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": spec,
        }

    def _spawn(self, work: Any, *, name: str) -> None:
        task = asyncio.create_task(work, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)


def _micro_time() -> str:
    """Now as a Kubernetes MicroTime."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = obj.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _name(obj: Mapping[str, Any]) -> str:
    return str(_meta(obj).get("name") or "")


def _version(obj: Mapping[str, Any]) -> str:
    return str(_meta(obj).get("resourceVersion") or "")


def _holder(obj: Mapping[str, Any]) -> str:
    return str(_spec(obj).get("holderIdentity") or "")


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    annotations = _meta(obj).get("annotations")
    return annotations if isinstance(annotations, Mapping) else {}
