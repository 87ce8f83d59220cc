"""Answer caching for the webhooks: a bounded TTL cache and request coalescing.

TokenReview and SubjectAccessReview answers are cached for seconds so that a
burst of requests costs one review; identical reviews already in flight are
shared rather than repeated. Failures to get an answer are never cached:
they reach every waiter of the shared call and the next request tries again.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["Coalescer", "TTLCache"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class TTLCache(Generic[K, V]):
    """Values that expire, least recently used evicted beyond `max_entries`.

    `hits` and `misses` count the lookups that found a live value and those
    that did not, for metrics to read.
    """

    def __init__(self, *, max_entries: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._entries: OrderedDict[K, tuple[float, V]] = OrderedDict()
        self._max = max_entries
        self._clock = clock
        self.hits = 0
        self.misses = 0

    def get(self, key: K) -> V | None:
        """The live value for `key`, or None."""
        entry = self._entries.get(key)
        if entry is not None and self._clock() >= entry[0]:
            del self._entries[key]
            entry = None
        if entry is None:
            self.misses += 1
            return None
        self.hits += 1
        self._entries.move_to_end(key)
        return entry[1]

    def put(self, key: K, value: V, *, ttl: float) -> None:
        """Keep `value` for `ttl` seconds (not at all when `ttl` is not positive)."""
        if ttl <= 0:
            return
        self._entries[key] = (self._clock() + ttl, value)
        self._entries.move_to_end(key)
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


class Coalescer(Generic[K, V]):
    """Runs one call per key at a time; concurrent callers with the same key share it."""

    def __init__(self) -> None:
        self._inflight: dict[K, asyncio.Task[V]] = {}

    async def run(self, key: K, call: Callable[[], Awaitable[V]]) -> V:
        """The result of `call()`, or of the identical call already running."""
        task = self._inflight.get(key)
        if task is None:
            task = asyncio.ensure_future(call())
            self._inflight[key] = task
            task.add_done_callback(lambda done: self._finished(key, done))
        # Shielded: one waiter giving up must not cancel the call the others wait for.
        return await asyncio.shield(task)

    def _finished(self, key: K, task: asyncio.Task[V]) -> None:
        if self._inflight.get(key) is task:
            del self._inflight[key]
        if not task.cancelled():
            task.exception()  # retrieved, so a failure nobody awaited is not logged as lost
