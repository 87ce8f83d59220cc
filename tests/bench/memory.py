"""The idle-session memory phase of the console benchmark.

Warms the server up (sessions opened and closed, so lazily built state and
imports are paid for), waits for its memory to settle, then has client
processes open idle sessions up to each requested level and reports what
the server's memory grew by per session, and the CPU it spent opening them.
With the bench harness's `--tracemalloc`, it also diffs the Python
allocations between the baseline and the last level.
"""

from __future__ import annotations

import asyncio
import re
import ssl
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp

from tests.bench.client import RAW, Target
from tests.bench.procs import Child, cpu_seconds, memory_kib, spawn

if TYPE_CHECKING:
    from tests.bench.bench_console import Server, Settings

__all__ = ["AFTER_CLOSE", "idle_table"]

PER_CLIENT = 2500
"""Sessions one client process holds (two descriptors' worth of headroom each)."""
CLIENT_CONCURRENCY = 16
"""Opens in flight per client process."""
SETTLE_STEP = 0.5
"""Seconds between memory samples while waiting for RSS to settle."""
AFTER_CLOSE = 5.0
"""Seconds after the last session closed when memory "after close" is read."""
WARMUP_SESSIONS = 64
WARMUP_BATCH = 16
OPEN_TIMEOUT = 30.0
"""Seconds one warm-up session may take to open or close."""


@dataclass(frozen=True)
class Level:
    """Memory and CPU at one count of idle sessions."""

    sessions: int
    memory: dict[str, int]
    open_seconds: float
    open_cpu: float
    failed: int


async def settle(pid: int, max_samples: int) -> dict[str, int]:
    """The server's memory once RSS stops moving (3 samples within 64 KiB) or after max_samples."""
    samples = [memory_kib(pid)]
    while len(samples) < max_samples:
        await asyncio.sleep(SETTLE_STEP)
        samples.append(memory_kib(pid))
        last = [s["Rss"] for s in samples[-3:]]
        if len(last) == 3 and max(last) - min(last) <= 64:
            break
    return samples[-1]


async def open_close(target: Target, machine: str, tls: ssl.SSLContext | None) -> None:
    """One whole session: TLS, upgrade (after the backend dial), close handshake."""
    async with target.connect(machine, RAW, tls, OPEN_TIMEOUT):
        pass


async def warm_up(server: Server, http: aiohttp.ClientSession) -> None:
    """Open and close a few sessions so the baseline includes one-time costs."""
    tls = server.target.ssl_context()
    for _ in range(0, WARMUP_SESSIONS, WARMUP_BATCH):
        # Distinct machines within a batch: no session takes over another.
        await asyncio.gather(
            *(open_close(server.target, f"m{i}", tls) for i in range(WARMUP_BATCH))
        )
    async with asyncio.timeout(30):
        await server.wait_sessions(http, 0)


async def open_clients(server: Server, first: int, count: int) -> list[Child]:
    """Client processes holding sessions `m{first}`…`m{first+count-1}`."""
    children = []
    target = server.target
    for start in range(first, first + count, PER_CLIENT):
        n = min(PER_CLIENT, first + count - start)
        children.append(
            await spawn(
                f"clients m{start}+{n}",
                "tests.bench.console_clients",
                # `--token=…` in one word: a random token may start with "-".
                *("--port", str(target.port), "--ca", str(target.ca), f"--token={target.token}"),
                *("--scheme", target.scheme, "--first", str(start), "--count", str(n)),
                *("--concurrency", str(CLIENT_CONCURRENCY)),
            )
        )
    return children


async def reach(
    server: Server, http: aiohttp.ClientSession, clients: list[Child], have: int, level: int
) -> Level:
    """Open sessions from `have` up to `level` and measure the server there."""
    cpu0, start = cpu_seconds(server.pid), time.perf_counter()
    new = await open_clients(server, have, level - have)
    clients += new
    # Generous: a loaded 2-core machine opens a few hundred TLS sessions per second.
    budget = 30 + (level - have) / 20
    async with asyncio.timeout(budget):
        reports = [await c.expect(r"opened (\d+) failed (\d+)") for c in new]
    elapsed, cpu = time.perf_counter() - start, cpu_seconds(server.pid) - cpu0
    failed = sum(int(r.group(2)) for r in reports)
    async with asyncio.timeout(30):
        await server.wait_sessions(http, level - failed)
    mem = await settle(server.pid, max_samples=40)
    return Level(level, mem, elapsed, cpu, failed)


async def close_clients(clients: list[Child]) -> None:
    """Let every client close its sessions, then make sure it is gone."""
    for c in clients:
        c.close_stdin()
    for c in clients:
        try:
            async with asyncio.timeout(60):
                await c.expect(r"^closed")
        finally:
            await c.stop()


def snapshot(server: Server, root: Path, index: int) -> Path:
    """Ask the harness for a tracemalloc snapshot; the file it will write."""
    server.child.proc.send_signal(10)  # SIGUSR1
    return root / f"trace.{index}"


async def load_snapshot(path: Path) -> tracemalloc.Snapshot:
    """Load a snapshot once the harness has written it (callers bound the wait)."""
    while True:
        try:
            return await asyncio.to_thread(tracemalloc.Snapshot.load, str(path))
        except (OSError, EOFError, ValueError):
            await asyncio.sleep(0.5)


async def idle_table(
    server: Server, http: aiohttp.ClientSession, root: Path, settings: Settings
) -> str:
    """Table 3 (and the tracemalloc diff when asked for)."""
    await warm_up(server, http)
    before = await settle(server.pid, max_samples=20)
    trace0 = snapshot(server, root, 0) if settings.tracemalloc else None
    clients: list[Child] = []
    levels: list[Level] = []
    after_close: dict[str, int] = {}
    diff = ""
    try:
        have = 0
        for level in settings.idle:
            levels.append(await reach(server, http, clients, have, level))
            have = level
        if trace0 is not None:
            async with asyncio.timeout(120):
                first = await load_snapshot(trace0)
                last = await load_snapshot(snapshot(server, root, 1))
            diff = trace_table(first, last, levels[-1].sessions)
    finally:
        await close_clients(clients)
    if levels:
        async with asyncio.timeout(60):
            await server.wait_sessions(http, 0)
        await asyncio.sleep(AFTER_CLOSE)  # the server gives memory back once closing is quiet
        after_close = await settle(server.pid, max_samples=20)
    return render(server, settings, before, levels, after_close) + diff


def render(
    server: Server,
    settings: Settings,
    before: dict[str, int],
    levels: list[Level],
    after_close: dict[str, int],
) -> str:
    """Table 3 in markdown."""
    variant = {
        "serve": "`python -m subres serve` (TLS)",
        "tls": "bench harness, TLS",
        "plain": "bench harness, plain TCP (no TLS)",
    }[settings.variant]
    if settings.ssl_buffer is not None:
        variant += f", asyncio TLS read buffer {settings.ssl_buffer} B"
    if settings.shared_ssl_buffer:
        variant += ", one asyncio TLS read buffer per process"
    if settings.tracemalloc:
        variant += ", tracemalloc on (inflates RSS)"
    for name, value in settings.server_env.items():
        variant += f", {name}={value}"
    lines = [
        f"### Server memory per idle console session ({variant}; goal ≤ 40 KiB)",
        "",
        f"Baseline after {WARMUP_SESSIONS} warm-up sessions: Rss {before['Rss'] / 1024:.1f} MiB, "
        f"Pss {before['Pss'] / 1024:.1f} MiB, Anonymous {before['Anonymous'] / 1024:.1f} MiB.",
        "",
        "| idle sessions | failed | server Rss MiB | KiB/session Rss | KiB/session Pss "
        "| KiB/session Anonymous | open phase s | server CPU s (open phase) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for lv in levels:
        n = lv.sessions - lv.failed
        per = {k: (lv.memory[k] - before[k]) / max(1, n) for k in before}
        lines.append(
            f"| {lv.sessions} | {lv.failed} | {lv.memory['Rss'] / 1024:.1f} | {per['Rss']:.1f} "
            f"| {per['Pss']:.1f} | {per['Anonymous']:.1f} | {lv.open_seconds:.1f} "
            f"| {lv.open_cpu:.2f} |"
        )
    if after_close:
        lines += [
            "",
            f"{AFTER_CLOSE:g} s after every session closed: "
            f"Rss {after_close['Rss'] / 1024:.1f} MiB "
            f"({(after_close['Rss'] - before['Rss']) / 1024:+.1f} MiB against the baseline).",
        ]
    return "\n".join(lines)


def trace_table(first: tracemalloc.Snapshot, last: tracemalloc.Snapshot, sessions: int) -> str:
    """The Python allocations that grew most between the baseline and the last level."""
    keep = [tracemalloc.Filter(False, tracemalloc.__file__)]
    stats = last.filter_traces(keep).compare_to(first.filter_traces(keep), "lineno")
    total = sum(s.size_diff for s in stats)
    lines = [
        "",
        f"#### tracemalloc: Python allocations grown at {sessions} sessions "
        f"({total / 1024 / max(1, sessions):.1f} KiB/session in all)",
        "",
        "| where allocated | KiB/session | blocks/session |",
        "| --- | ---: | ---: |",
    ]
    for s in sorted(stats, key=lambda s: s.size_diff, reverse=True)[:40]:
        frame = s.traceback[0]
        where = f"{_short(frame.filename)}:{frame.lineno}"
        lines.append(
            f"| `{where}` | {s.size_diff / 1024 / sessions:.2f} | {s.count_diff / sessions:.1f} |"
        )
    return "\n" + "\n".join(lines)


def _short(filename: str) -> str:
    # Paths relative to site-packages, the stdlib or the checkout read better in a table.
    return re.sub(r"^.*?(site-packages|python3\.\d+|/work/[^/]+)/", "", filename)
