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
connection that ends is dialed again with backoff; whoever was attached sees
the console end. A console that stops opting in, fails its checks or goes
away is let go: its connection is closed.

Memory per kept console: its scrollback (at most `consoles.scrollback`), one
backend connection and one task; `tests/bench/bench_console.py` measures it.
At most `consoles.maxKept` consoles are kept, shared fairly between
namespaces, and at most `consoles.maxKeptPerNamespace` of one namespace
(`sessions.fairness`): one namespace annotating many cannot take every place.

Which replica keeps a console is an exclusive session slot of its own
(`console-keeper`), claimed as `preserveSession` would: a replica takes it
only while no other holds it. Standalone that is this replica's table; in
cluster mode it is a session Lease, so exactly one replica keeps a console,
and when that replica dies, another takes its place once the Lease expired.
A replica that does not keep a console answers its writers 503 naming the
holder (its observers see nothing of it).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
from collections.abc import Mapping

from subres.engine.stream import ByteStream
from subres.kube.status import StatusError
from subres.server import sharing, subresource
from subres.server.state import State
from subres.server.subresource import Target
from subres.sessions import fairness
from subres.sessions.registry import Busy, Claim, SessionKey
from subres.sessions.scrollback import Scrollback

__all__ = ["KEEPER", "Keeper", "KeptConsole"]

log = logging.getLogger(__name__)

FIRST_RETRY = 0.5
"""Seconds before dialing a kept console again, doubled after each failure..."""
LAST_RETRY = 30.0
"""...up to this."""
STEADY = 60.0
"""A connection that lasted this many seconds starts the next retries from the first."""
CLAIM_RETRY = 2.0
"""Seconds between attempts to keep a console another replica keeps."""
KEEPER = "keeper"
"""The user a keeper's slot is held by (named to whoever it is taken from)."""


class KeptConsole:
    """One kept console: its connection, dialed again whenever it ends, read into its hub."""

    def __init__(self, state: State, target: Target) -> None:
        self.key = sharing.key(target)
        self.slot = sharing.keeper_key(target)
        """Who keeps the console: an exclusive slot (a Lease in cluster mode)."""
        self.target = target
        """The parent as last seen (kept up to date while its endpoint stays the same)."""
        self.url = subresource_url(target)
        self.status = "waiting to be dialed"
        """Why there is no connection, in words (while there is none)."""
        self._state = state
        self._backend: ByteStream | None = None
        self.hub = sharing.hub(state, target)
        self.hub.keep(self, Scrollback(state.config.consoles.scrollback))
        self.task = asyncio.create_task(self._run(), name=f"keep {self.key}")

    @property
    def backend(self) -> ByteStream | None:
        """The kept connection, or None while it is being dialed."""
        return self._backend

    async def stop(self) -> None:
        """Close the connection and stop keeping the console."""
        self.task.cancel()
        await asyncio.wait([self.task])

    async def close(self, code: int = 1000, reason: str = "") -> None:
        """The slot was taken (another replica keeps the console now): let the connection go."""
        log.info("%s: %s", self.key, reason)
        if self._backend is not None:
            await self._backend.close()

    def drop(self) -> None:
        """Nothing to drop at once: `close` lets the connection go."""

    async def _run(self) -> None:
        try:
            while True:
                claim = await self._claim()
                try:
                    await self._keep_while(claim)
                finally:
                    self._state.sessions.release(claim)
        finally:
            self.hub.unkeep(self)

    async def _claim(self) -> Claim:
        """The slot, once no other replica holds it."""
        while True:
            try:
                claim = await self._state.sessions.claim(self.slot, user=KEEPER, preserve=True)
            except Busy:
                self.status = "another replica keeps it"
            except StatusError as exc:
                self.status = exc.message
            else:
                claim.session = self  # taken over: `close`
                return claim
            # Another replica's Lease: nothing here signals that it expired.
            await asyncio.sleep(CLAIM_RETRY * random.uniform(0.8, 1.2))

    async def _keep_while(self, claim: Claim) -> None:
        """Keep the console connected, dialing again with backoff, until the slot is lost."""
        retry = FIRST_RETRY
        while claim.lost is None:
            started = asyncio.get_running_loop().time()
            await self._keep()
            if claim.lost is not None:
                return
            if asyncio.get_running_loop().time() - started > STEADY:
                retry = FIRST_RETRY
            # Backoff between dials, not synchronisation: nothing signals a console's return.
            await asyncio.sleep(retry * random.uniform(0.8, 1.2))
            retry = min(retry * 2, LAST_RETRY)

    async def _keep(self) -> None:
        """Dial once and relay until the connection ends."""
        try:
            backend = await subresource.connect(
                self._state, self.target, subresource.endpoint_url(self.target)
            )
        except StatusError as exc:
            self.status = exc.message
            log.info("%s: not kept for now: %s", self.key, exc.message)
            return
        self._backend = backend
        self.hub.source = self
        log.info("%s: kept", self.key)
        kept = self._state.metrics.consoles_kept
        kept.inc()
        try:
            while chunk := await backend.read():
                await self.hub.deliver(chunk)
                # A kept console idles in `read`: holding the last chunk meanwhile would
                # cost every kept console a read's worth of memory (up to 256 KiB).
                del chunk
            self.status = "the console's connection ended"
        except (OSError, RuntimeError) as exc:
            self.status = f"the console's connection failed: {exc}"
        finally:
            kept.dec()
            self._backend = None
            self.hub.release(self)
            self.hub.end()
            await backend.close()
        log.info("%s: %s", self.key, self.status)


class Keeper:
    """Keeps the consoles that opt in, following the parent caches."""

    def __init__(self, state: State) -> None:
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

        for cache in self._state.caches.values():
            cache.follow(changed)
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
        limits = self._state.config.consoles
        candidates = self._candidates()
        chosen = fairness.share(
            candidates, total=limits.max_kept, per_namespace=limits.max_kept_per_namespace
        )
        if sum(map(len, chosen.values())) < sum(map(len, candidates.values())):
            self._warn(limits.max_kept, limits.max_kept_per_namespace)
        return {sharing.key(t): t for targets in chosen.values() for t in targets}

    def _candidates(self) -> dict[str, list[Target]]:
        """Every console that opts in and passes its checks, by namespace, in name order."""
        limits = self._state.config.consoles
        found: dict[str, list[Target]] = collections.defaultdict(list)
        for parent in self._state.config.parents:
            spec = parent.subresources.get("console")
            cache = self._state.caches.get(parent.resource)
            if spec is None or spec.keep == "never" or cache is None:
                continue
            for obj in sorted(cache.objects(), key=_name):
                if not spec.opted_in(spec.keep, obj, limits.keep_annotation):
                    continue
                namespace, name = _name(obj)
                try:
                    target = subresource.checked(self._state, parent, spec, namespace, name)
                except StatusError:
                    continue
                found[namespace].append(target)
        return found

    def _warn(self, limit: int, per_namespace: int) -> None:
        if not self._warned:
            log.warning(
                "more consoles opt in to be kept than consoles.maxKept (%d) or "
                "consoles.maxKeptPerNamespace (%d) allow; each namespace keeps its share",
                limit,
                per_namespace,
            )
            self._warned = True


def subresource_url(target: Target) -> str:
    """The endpoint `target` names, or "" when it names none."""
    try:
        return subresource.endpoint_url(target)
    except StatusError:
        return ""


def _name(obj: Mapping[str, object]) -> tuple[str, str]:
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    return str(meta.get("namespace") or "default"), str(meta.get("name") or "")
