"""The memory-cycles phase of the console benchmark: does memory come back after a burst?

After the warm-up, client processes open `--cycle-sessions` idle console
sessions, hold them until the server counts them all, and close them; six
times (`--cycles`). Each row gives the server's RSS with the sessions open
and `AFTER` seconds after the server counted the last one closed, and how far
that is above the baseline (taken after the warm-up, once RSS settled).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import aiohttp

from tests.bench.memory import AFTER_CLOSE as AFTER
from tests.bench.memory import close_clients, open_clients, settle, warm_up
from tests.bench.procs import memory_kib

if TYPE_CHECKING:
    from tests.bench.bench_console import Server, Settings

__all__ = ["cycles_table"]

GOAL = 25
"""Percent above the baseline RSS allowed shortly after a burst ends."""


async def cycles_table(server: Server, http: aiohttp.ClientSession, settings: Settings) -> str:
    """The cycles table in markdown."""
    await warm_up(server, http)
    baseline = (await settle(server.pid, max_samples=20))["Rss"]
    count = settings.cycle_sessions
    lines = [
        f"### Server memory over {settings.cycles} bursts of {count} idle console sessions "
        f"(goal: within {GOAL} % of the baseline after each)",
        "",
        f"Baseline after the warm-up: Rss {baseline / 1024:.1f} MiB.",
        "",
        f"| cycle | sessions | Rss open MiB | Rss {AFTER:g} s after close MiB "
        "| after close - baseline |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for cycle in range(1, settings.cycles + 1):
        clients = await open_clients(server, 0, count)
        try:
            async with asyncio.timeout(30 + count / 20):
                for c in clients:
                    await c.expect(r"opened (\d+) failed (\d+)")
                await server.wait_sessions(http, count)
            peak = (await settle(server.pid, max_samples=20))["Rss"]
        finally:
            await close_clients(clients)
        async with asyncio.timeout(60):
            await server.wait_sessions(http, 0)
        await asyncio.sleep(AFTER)  # what is measured: RSS this long after the burst
        after = memory_kib(server.pid)["Rss"]
        grown = 100 * (after - baseline) / baseline
        lines.append(
            f"| {cycle} | {count} | {peak / 1024:.1f} | {after / 1024:.1f} "
            f"| {(after - baseline) / 1024:+.1f} MiB ({grown:+.0f} %) |"
        )
    return "\n".join(lines)
