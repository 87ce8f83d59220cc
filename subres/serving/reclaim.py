"""Giving memory back to the system after a burst of sessions or connections ends.

Measured (issue 10): after thousands of sessions close, the server's RSS
stays hundreds of MiB above its baseline without leaking. Three things hold
it: the closed connections' objects, which form reference cycles (aiohttp's
request handler, request, WebSocket response and writer, the TLS transport)
that only a full collection frees, and Python's default thresholds rarely
run one; free space glibc keeps in its heaps instead of returning it; and
pymalloc arenas left fragmented, which nothing but a different allocator fixes:
`subres serve` runs with glibc's (`use_system_malloc`), whose free pages
`malloc_trim` can return wherever they lie. A `Reclaimer` runs a full `gc.collect()` and
then glibc's `malloc_trim(0)` when the load drops after a burst: live
sessions, open connections or TLS handshakes in progress, having reached
`min_burst` since the last reclaim, fall to half of that peak or to zero.
It waits until the closing has been quiet for `delay` (each further drop
postpones it, so a burst that takes seconds to close is reclaimed once, at
its end) and runs at most once per `min_interval`. A periodic check catches what no count shows (TLS
handshakes that never finished): when RSS has grown since the last reclaim
while every count is low.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Reclaimed", "Reclaimer", "rss_bytes", "use_system_malloc"]

log = logging.getLogger(__name__)

_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    """This process's resident set size, from /proc/self/statm (cheap)."""
    with open("/proc/self/statm", "rb") as statm:
        return int(statm.read().split()[1]) * _PAGE


def use_system_malloc() -> None:
    """Run this command again with `PYTHONMALLOC=malloc`, unless PYTHONMALLOC is set.

    pymalloc keeps 1 MiB arenas that one surviving object pins; after a burst
    of thousands of sessions they held +45 MiB that no collection returned.
    With glibc's allocator `malloc_trim` returns every free page. The exec
    keeps the PID; setting PYTHONMALLOC (to anything) opts out.
    """
    if "PYTHONMALLOC" in os.environ or not sys.executable:
        return
    env = {**os.environ, "PYTHONMALLOC": "malloc"}
    os.execve(sys.executable, [sys.executable, "-m", "subres", *sys.argv[1:]], env)


def _malloc_trim() -> Callable[[], int] | None:
    """glibc's `malloc_trim(0)`, or None where the C library has none (musl)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: int(trim(0))


@dataclass(frozen=True)
class Reclaimed:
    """What one reclaim did."""

    collected: int
    """Objects the full collection found unreachable."""
    rss_before: int
    rss_after: int
    seconds: float


class Reclaimer:
    """Decides when to collect and trim, and does it on the event loop."""

    def __init__(
        self,
        *,
        delay: float = 1.0,
        min_interval: float = 5.0,
        check_interval: float = 10.0,
        growth: float = 0.25,
        min_burst: int = 32,
    ) -> None:
        self.delay = delay
        """Seconds of quiet after the last drop before the reclaim: closing finishes first."""
        self.min_interval = min_interval
        """Seconds between two reclaims at least (a full collection costs CPU)."""
        self.check_interval = check_interval
        """Seconds between periodic looks at RSS."""
        self.growth = growth
        """Periodic reclaim when RSS exceeds the last reclaim's result by this fraction."""
        self.min_burst = min_burst
        """A count must have reached this since the last reclaim for its drop to count."""
        self.last: Reclaimed | None = None
        self.runs = 0
        self._trim = _malloc_trim()
        self._peaks: dict[str, int] = {}
        self._levels: dict[str, int] = {}
        self._last_run = -min_interval
        self._settled_rss = 0
        self._pending: asyncio.TimerHandle | None = None
        self._periodic: asyncio.Task[None] | None = None

    def level(self, what: str, now: int) -> None:
        """`what` (sessions, connections) stands at `now`: reclaim if it fell far enough."""
        self._levels[what] = now
        peak = max(self._peaks.get(what, 0), now)
        self._peaks[what] = peak
        if peak >= self.min_burst and now * 2 <= peak:
            self.request()

    def _low(self) -> bool:
        """Every count at most half its peak since the last reclaim (or zero)."""
        return all(now * 2 <= self._peaks.get(what, 0) for what, now in self._levels.items())

    @property
    def due(self) -> float | None:
        """Loop time at which the next reclaim runs, or None when none is asked for."""
        return None if self._pending is None else self._pending.when()

    def request(self) -> None:
        """Reclaim once nothing more has happened for `delay` (and not within
        `min_interval` of the last reclaim)."""
        if self._pending is not None:
            self._pending.cancel()
        loop = asyncio.get_running_loop()
        wait = max(self.delay, self._last_run + self.min_interval - loop.time())
        self._pending = loop.call_later(wait, self._run)

    def start(self) -> None:
        """Begin the periodic check (call on the running loop)."""
        if self._periodic is None:
            self._settled_rss = rss_bytes()
            self._periodic = asyncio.create_task(self._check())

    async def stop(self) -> None:
        """Stop the periodic check and forget any pending reclaim."""
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
        if self._periodic is not None:
            self._periodic.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._periodic
            self._periodic = None

    def reclaim(self) -> Reclaimed:
        """Collect every generation, then hand glibc's free pages back; now."""
        started = time.perf_counter()
        before = rss_bytes()
        collected = gc.collect()
        if self._trim is not None:
            self._trim()
        after = rss_bytes()
        self.runs += 1
        self._settled_rss = after
        self.last = Reclaimed(collected, before, after, time.perf_counter() - started)
        log.info(
            "reclaimed memory: %d objects collected, RSS %.1f -> %.1f MiB in %.0f ms",
            collected,
            before / 2**20,
            after / 2**20,
            self.last.seconds * 1000,
        )
        return self.last

    def _run(self) -> None:
        self._pending = None
        self._last_run = asyncio.get_running_loop().time()
        self._peaks = dict(self._levels)
        self.reclaim()

    async def _check(self) -> None:
        while True:
            await asyncio.sleep(self.check_interval)
            if self._low() and rss_bytes() > self._settled_rss * (1 + self.growth):
                self.request()
