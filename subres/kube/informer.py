"""List+watch: keeps a local copy of a collection in the main apiserver current.

Owns the reflector loop: list every page, hand the complete listing to a
`Sink` (a `ParentCache`, or the authentication ConfigMap holder), then watch
from the list's resourceVersion with bookmarks, following each event's
resourceVersion. A 410 Gone (expired version or continue token) relists at
once; any other failure waits an exponential, jittered and bounded backoff
and relists. A full relist also happens every `relist_interval` seconds,
repairing anything a watch could have missed (client-go's "resync" only
replays its cache to handlers; this one asks the apiserver again). The
request path never waits on any of this: it reads the sink.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from subres.kube.client import ApiError, ListWatch, WatchEvent, status_error

__all__ = ["Backoff", "Informer", "InformerSettings", "Sink"]

log = logging.getLogger(__name__)

GONE = 410


@dataclass(frozen=True)
class InformerSettings:
    """How an informer pages, watches, relists and backs off."""

    relist_interval: float = 600.0
    """Seconds between full relists from the apiserver."""
    watch_timeout: int = 300
    """`timeoutSeconds` asked of each watch; the watch is reopened from the last version."""
    page_size: int = 500
    """Objects per list page."""
    backoff_initial: float = 0.8
    """Seconds to wait after the first failure."""
    backoff_max: float = 30.0
    """The longest wait between attempts, jitter included."""
    backoff_factor: float = 2.0
    """Growth of the wait after each further failure."""
    jitter: float = 0.5
    """Up to this fraction of the wait is added at random, so replicas do not retry in step."""


class Sink(Protocol):
    """Where an informer puts what it learns (`ParentCache` is one)."""

    def replace(self, objects: Iterable[Mapping[str, Any]]) -> None:
        """A complete listing."""
        ...

    def upsert(self, obj: Mapping[str, Any]) -> None:
        """An object was added or changed."""
        ...

    def delete(self, obj: Mapping[str, Any]) -> None:
        """An object was deleted."""
        ...


class Backoff:
    """Exponential waits with jitter, capped; reset after a success."""

    def __init__(self, settings: InformerSettings, *, rng: random.Random | None = None) -> None:
        self._settings = settings
        self._rng = rng or random.Random()
        self._failures = 0

    def next(self) -> float:
        """Seconds to wait before the next attempt."""
        s = self._settings
        base = s.backoff_initial * s.backoff_factor ** min(self._failures, 64)
        self._failures += 1
        return min(s.backoff_max, base * (1 + s.jitter * self._rng.random()))

    def reset(self) -> None:
        """Forget the failures."""
        self._failures = 0


class Informer:
    """Keeps `sink` equal to the collection `source` lists and watches."""

    def __init__(
        self,
        *,
        source: ListWatch,
        sink: Sink,
        name: str,
        settings: InformerSettings | None = None,
    ) -> None:
        self.source = source
        self.sink = sink
        self.name = name
        self.settings = settings or InformerSettings()

    async def run(self) -> None:
        """List and watch until cancelled."""
        backoff = Backoff(self.settings)
        while True:
            try:
                version = await self._list()
                backoff.reset()
                await self._watch(version)
            except ApiError as exc:
                if exc.status == GONE:
                    log.info("%s: %s; relisting", self.name, exc)
                    continue
                delay = backoff.next()
                log.warning("%s: %s; retrying in %.1fs", self.name, exc, delay)
                await asyncio.sleep(delay)

    async def _list(self) -> str:
        objects: list[Mapping[str, Any]] = []
        token = ""
        while True:
            page = await self.source.list(limit=self.settings.page_size, continue_token=token)
            objects.extend(page.items)
            token = page.continue_token
            if not token:
                break
        self.sink.replace(objects)
        log.info(
            "%s: listed %d objects at version %s", self.name, len(objects), page.resource_version
        )
        return page.resource_version

    async def _watch(self, version: str) -> None:
        """Follow changes from `version` until the next full relist is due."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.relist_interval
        try:
            async with asyncio.timeout_at(deadline):
                while True:
                    remaining = math.ceil(deadline - loop.time())
                    timeout = max(1, min(self.settings.watch_timeout, remaining))
                    async with self.source.watch(
                        resource_version=version, timeout_seconds=timeout
                    ) as events:
                        async for event in events:
                            version = self._apply(event, version)
        except TimeoutError:
            log.debug("%s: full relist due", self.name)

    def _apply(self, event: WatchEvent, version: str) -> str:
        """Hand one event to the sink; the resourceVersion to resume from."""
        obj = event.object
        if event.type == "ERROR":
            raise status_error(obj, default=500)
        if event.type in ("ADDED", "MODIFIED"):
            self.sink.upsert(obj)
        elif event.type == "DELETED":
            self.sink.delete(obj)
        elif event.type != "BOOKMARK":
            raise ApiError(0, f"unknown watch event type {event.type!r}", reason="BadResponse")
        meta = obj.get("metadata")
        new = meta.get("resourceVersion") if isinstance(meta, dict) else None
        return str(new) if new else version
