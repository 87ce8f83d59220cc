"""The console keeper: consoles whose backend connection stays open while nobody is attached.

A parent kind opts in with `console.keep: always`, or each object does with
`keep: annotated` (the default) and the `consoles.keepAnnotation` annotation
set to "true". The keeper follows the parent caches; every console that opts
in and passes its state rules (a Running machine, say) gets one connection,
dialed as a writer's would be (endpoint policy and all), read without pause
into the console's hub: a bounded scrollback (`consoles.scrollback` bytes,
replayed to whoever attaches, `?tail=N` for its last lines), the observers,
a recording, and the writer if there is one (one at a time, who holds the
connection back while it is slow, as on a connection of its own). A
connection that ends is dialed again with backoff, and at once when the
node agents change (a node's new agent became ready); whoever was attached
sees the console end, or, when the connection failed (its node's agent was
lost), is closed with 1001 and the reason, to reconnect: the console is
still kept. A console that stops opting in, fails its checks or goes away
is let go: its connection is closed.

Memory per kept console: its scrollback (at most `consoles.scrollback`), one
backend connection and one task; `tests/bench/bench_console.py` measures it.
At most `consoles.maxKept` consoles are kept, shared fairly between
namespaces, and at most `consoles.maxKeptPerNamespace` of one namespace
(`sessions.fairness`): one namespace annotating many cannot take every place.

The replica that owns a console (`sessions.members`) keeps it; the others
relay its writers and observers there. When the members change, each replica
keeps what it owns now and lets go of the rest (a replica that just joined
waits until it settled); a console whose owner was lost is noted in its next
recording.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import random
from collections.abc import Iterator, Mapping

from subres.backends import endpoint as endpoints
from subres.config import ParentSpec
from subres.engine.stream import ByteStream
from subres.engine.websocket import CloseCode
from subres.kube.status import StatusError
from subres.sessions import fairness, sharing
from subres.sessions import target as targets
from subres.sessions.members import rendezvous
from subres.sessions.registry import SessionKey
from subres.sessions.runtime import Runtime
from subres.sessions.scrollback import Scrollback
from subres.sessions.target import Target, endpoint_url

__all__ = ["Keeper", "KeptConsole", "dialable"]

log = logging.getLogger(__name__)

FIRST_RETRY = 0.5
"""Seconds before dialing a kept console again, doubled after each failure..."""
LAST_RETRY = 30.0
"""...up to this."""
STEADY = 60.0
"""A connection that lasted this many seconds starts the next retries from the first."""


class KeptConsole:
    """One kept console: its connection, dialed again whenever it ends, read into its hub."""

    def __init__(self, state: Runtime, target: Target) -> None:
        self.key = targets.key(target)
        self.target = target
        """The parent as last seen (kept up to date while its endpoint stays the same)."""
        self.url = subresource_url(target)
        self.status = "waiting to be dialed"
        """Why there is no connection, in words (while there is none)."""
        self._state = state
        self._backend: ByteStream | None = None
        self.hub = sharing.hub(state, target)
        self.scrollback = Scrollback(state.config.consoles.scrollback)
        """What the console printed (its log: `previous` begins at the last redial)."""
        self.hub.keep(self, self.scrollback)
        self._wake = asyncio.Event()
        self.task = asyncio.create_task(self._run(), name=f"keep {self.key}")

    @property
    def backend(self) -> ByteStream | None:
        """The kept connection, or None while it is being dialed."""
        return self._backend

    async def stop(self) -> None:
        """Close the connection and stop keeping the console."""
        self.task.cancel()
        await asyncio.wait([self.task])

    def wake(self) -> None:
        """Something that may bring the console back changed: dial now, not after the backoff."""
        self._wake.set()

    async def _run(self) -> None:
        """Keep the console connected, dialing again with backoff, until stopped."""
        retry = FIRST_RETRY
        try:
            while True:
                started = asyncio.get_running_loop().time()
                # A change during the dial counts: it may be what the dial missed.
                self._wake.clear()
                await self._keep()
                if asyncio.get_running_loop().time() - started > STEADY:
                    retry = FIRST_RETRY
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(retry * random.uniform(0.8, 1.2)):
                        await self._wake.wait()
                retry = min(retry * 2, LAST_RETRY)
        finally:
            self.hub.unkeep(self)

    async def _keep(self) -> None:
        """Dial once and relay until the connection ends."""
        try:
            backend = await self._state.backends.connect(self.target, endpoint_url(self.target))
        except StatusError as exc:
            self.status = exc.message
            log.info("%s: not kept for now: %s", self.key, exc.message)
            return
        self._backend = backend
        self.scrollback.connected()
        self.hub.source = self
        log.info("%s: kept", self.key)
        kept = self._state.metrics.consoles_kept
        kept.inc()
        lost = ""
        try:
            while chunk := await backend.read():
                await self.hub.deliver(chunk)
                # A kept console idles in `read`: holding the last chunk meanwhile would
                # cost every kept console a read's worth of memory (up to 256 KiB).
                del chunk
            self.status = "the console's connection ended"
        except (OSError, RuntimeError) as exc:
            lost = _lost(exc)
            self.status = f"the console's connection failed: {exc}"
        finally:
            kept.dec()
            self._backend = None
            self.hub.release(self)
            if lost:
                # Still kept, and dialed again: those attached come back by reconnecting.
                self.hub.cut(lost, CloseCode.GOING_AWAY)
            else:
                self.hub.end()
            await backend.close()
        log.info("%s: %s", self.key, self.status)


class Keeper:
    """Keeps the consoles that opt in, following the parent caches."""

    def __init__(self, state: Runtime) -> None:
        self._state = state
        self.consoles: dict[SessionKey, KeptConsole] = {}
        self._dirty = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._warned = False

    async def start(self) -> None:
        """Follow the caches and keep what opts in."""
        loop = asyncio.get_running_loop()

        def changed() -> None:
            # Standalone mode fills its caches from a worker thread.
            loop.call_soon_threadsafe(self._dirty.set)

        self._state.backends.follow(changed)
        self._state.backends.follow_agents(self._agents_changed)
        self._state.owners.on_change(self._moved)
        self._dirty.set()
        self._task = asyncio.create_task(self._follow(), name="keeper")

    async def stop(self) -> None:
        """Let every console go."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task])
        consoles, self.consoles = list(self.consoles.values()), {}
        await asyncio.gather(*(console.stop() for console in consoles))

    async def _follow(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            await self.reconcile()

    def _agents_changed(self) -> None:
        """A node's agent came or went: a console waiting for a connection tries again now,
        and a connected one redials at once when its connection ends.

        In a rolling update the node's next agent is Ready while the old one still carries
        the console; when the old one stops, the console's backoff (grown by earlier
        failures, up to `LAST_RETRY`) must not stand between it and the agent waiting.
        """
        for console in self.consoles.values():
            console.wake()

    def _moved(self, previous: tuple[str, ...]) -> None:
        """The members changed: note the consoles of a lost owner that are this replica's now."""
        owners = self._state.owners
        if owners.lost:
            for unit, target in self._wanted().items():
                was = rendezvous(unit, previous)
                if unit not in self.consoles and was in owners.lost:
                    sharing.hub(self._state, target).notes.append(
                        f"the replica {was} that kept this console was lost; "
                        f"{owners.replica} keeps it now"
                    )
        self._dirty.set()

    async def reconcile(self) -> None:
        """Keep what opts in now, let go of the rest; a changed endpoint is dialed anew."""
        wanted = self._wanted()
        stale = [
            key
            for key, console in self.consoles.items()
            if key not in wanted or console.url != subresource_url(wanted[key])
        ]
        await asyncio.gather(*(self.consoles.pop(key).stop() for key in stale))
        for key, target in wanted.items():
            if key in self.consoles:
                self.consoles[key].target = target
            else:
                self.consoles[key] = KeptConsole(self._state, target)

    def _wanted(self) -> dict[SessionKey, Target]:
        """The consoles this replica keeps: those that opt in, pass their checks, are its own."""
        limits = self._state.config.consoles
        if not self._state.owners.settled:
            return {}
        candidates = self._candidates()
        chosen = fairness.share(
            candidates, total=limits.max_kept, per_namespace=limits.max_kept_per_namespace
        )
        if sum(map(len, chosen.values())) < sum(map(len, candidates.values())):
            self._warn(limits.max_kept, limits.max_kept_per_namespace)
        return {targets.key(t): t for chosen_ in chosen.values() for t in chosen_}

    def _candidates(self) -> dict[str, list[Target]]:
        """The consoles this replica owns that opt in and pass their checks, by namespace,
        in name order."""
        owners = self._state.owners
        found: dict[str, list[Target]] = collections.defaultdict(list)
        for parent in self._state.config.parents:
            for target in self._opted_in(parent):
                if owners.mine(targets.key(target)):
                    found[target.namespace].append(target)
        return found

    def _opted_in(self, parent: ParentSpec) -> Iterator[Target]:
        """Each console of `parent`'s objects that opts in, passes its checks and names an
        endpoint it can be dialled at, in order: a place is worth only a connection."""
        consoles = [c for c in parent.all_consoles() if c.keep != "never"]
        if not consoles:
            return
        annotation = self._state.config.consoles.keep_annotation
        for obj in sorted(self._state.backends.objects(parent), key=_name):
            namespace, name = _name(obj)
            for spec in consoles:
                if not spec.opted_in(spec.keep, obj, annotation):
                    continue
                try:
                    target = self._state.backends.checked(parent, spec, namespace, name)
                except StatusError:
                    continue
                if dialable(target):
                    yield target

    def _warn(self, limit: int, per_namespace: int) -> None:
        if not self._warned:
            log.warning(
                "more consoles opt in to be kept than consoles.maxKept (%d) or "
                "consoles.maxKeptPerNamespace (%d) allow; each namespace keeps its share",
                limit,
                per_namespace,
            )
            self._warned = True


def _lost(exc: BaseException) -> str:
    """Why a kept connection failed, in words its clients read (a relay says what it lost)."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"the console's connection failed: {exc.strerror}"
    return str(exc) or type(exc).__name__


def subresource_url(target: Target) -> str:
    """The endpoint `target` names, or "" when it names none."""
    try:
        return endpoint_url(target)
    except StatusError:
        return ""


def dialable(target: Target) -> bool:
    """Whether `target` names an endpoint that is a URL subres dials (the endpoint policy
    and the dial itself decide the rest, as for any session)."""
    url = subresource_url(target)
    try:
        endpoints.parse(url)
    except endpoints.EndpointError:
        return False
    return True


def _name(obj: Mapping[str, object]) -> tuple[str, str]:
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    return str(meta.get("namespace") or "default"), str(meta.get("name") or "")
