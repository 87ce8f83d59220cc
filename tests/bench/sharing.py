"""The shared-console phases of the console benchmark: observers, and kept consoles.

- `observers`: the writer's echo round trip (`v5.channel.k8s.io`, `--payload`
  bytes) with 0, 1 and 50 observers on the same console, in three interleaved
  rounds so that drift (a busy neighbour, clock scaling) spreads over every
  level. The observers are held by a separate client process that reads
  everything, as terminals would. With the server's CPU per round trip and
  its memory per observer. Goal: one observer slows the writer by ≤ 10 %.
- `kept`: a fresh server with 100 machines; the annotation that keeps their
  consoles is added while it runs, and its memory and CPU are read idle, then
  again once 70 KiB have gone through each console (its scrollback full),
  and once more after another 70 KiB (what the first round's sessions left
  in the allocator is reused, not added to).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import yaml

from tests.bench.client import V5
from tests.bench.memory import settle
from tests.bench.procs import Child, cpu_seconds, spawn

if TYPE_CHECKING:
    from tests.bench.bench_console import Server, Settings

__all__ = ["kept_machines", "kept_table", "observers_table"]

OBSERVERS = (0, 1, 50)
ROUNDS = 3
MACHINE = "m2"
KEPT = 100
FILL = 70 * 1024
"""Bytes sent through each kept console: more than its 64 KiB scrollback holds."""
KEEP = "subres.dev/keep-console"

RoundTrips = Callable[[int, bytes], Awaitable[list[int]]]
"""`count` round trips of `payload` on the console under test: their times in ns."""


async def hold_observers(server: Server, count: int) -> Child:
    """A client process holding `count` observers of MACHINE, reading all they receive."""
    target = server.target
    child = await spawn(
        f"{count} observers",
        "tests.bench.console_clients",
        *("--port", str(target.port), "--ca", str(target.ca), f"--token={target.token}"),
        *("--scheme", target.scheme, "--first", "0", "--count", str(count)),
        *("--machine", MACHINE, "--sub", "console-observe", "--subprotocol", V5, "--drain"),
    )
    async with asyncio.timeout(60):
        report = await child.expect(r"opened (\d+) failed (\d+)")
    if int(report.group(2)):
        await child.stop()
        raise RuntimeError(f"{report.group(2)} of {count} observers failed to open")
    return child


async def observers_table(
    server: Server, http: aiohttp.ClientSession, settings: Settings, roundtrips: RoundTrips
) -> str:
    """The writer's round trip with 0, 1 and 50 observers, interleaved over three rounds."""
    payload = os.urandom(settings.payload)
    count = max(50, settings.roundtrips // ROUNDS)
    samples: dict[int, list[int]] = {n: [] for n in OBSERVERS}
    cpu: dict[int, float] = dict.fromkeys(OBSERVERS, 0.0)
    memory: dict[int, list[int]] = {n: [] for n in OBSERVERS}
    for _ in range(ROUNDS):
        holders: list[Child] = []
        try:
            held = 0
            for level in OBSERVERS:
                if level > held:
                    holders.append(await hold_observers(server, level - held))
                    held = level
                async with asyncio.timeout(60):
                    await server.wait_sessions(http, level)
                memory[level].append((await settle(server.pid, max_samples=10))["Rss"])
                cpu0 = cpu_seconds(server.pid)
                samples[level] += await roundtrips(count, payload)
                cpu[level] += cpu_seconds(server.pid) - cpu0
        finally:
            for holder in holders:
                await holder.stop()
    return _render_observers(settings, count, samples, cpu, memory)


def _render_observers(
    settings: Settings,
    count: int,
    samples: dict[int, list[int]],
    cpu: dict[int, float],
    memory: dict[int, list[int]],
) -> str:
    alone = statistics.median(samples[0])
    lines = [
        f"### The writer's round trip with observers on its console ({settings.payload}-byte "
        f"messages, `{V5}`, {ROUNDS} interleaved rounds of {count}; goal: 1 observer ≤ +10 %)",
        "",
        "| observers | p50 µs | p99 µs | mean µs | p50 against none | server CPU µs "
        "per round trip | server Rss KiB per observer |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    base_rss = statistics.mean(memory[0])
    for level in OBSERVERS:
        ordered = sorted(samples[level])
        p50 = statistics.median(ordered)
        p99 = ordered[min(len(ordered) - 1, len(ordered) * 99 // 100)]
        per_trip = 1e6 * cpu[level] / len(ordered)
        rss = (statistics.mean(memory[level]) - base_rss) / level if level else 0.0
        lines.append(
            f"| {level} | {p50 / 1e3:.0f} | {p99 / 1e3:.0f} | "
            f"{statistics.fmean(ordered) / 1e3:.0f} | {100 * (p50 / alone - 1):+.1f} % | "
            f"{per_trip:.0f} | {rss:.1f} |"
        )
    return "\n".join(lines)


def kept_machines(path: Path, backend_port: int, *, kept: bool) -> None:
    """k0…k99 on the echo backend; their consoles kept when `kept`."""
    annotations = {KEEP: "true"} if kept else {}
    docs: list[dict[str, Any]] = [
        {
            "apiVersion": "subres.dev/v1alpha1",
            "kind": "Machine",
            "metadata": {"name": f"k{i}", "namespace": "default", "annotations": annotations},
            "status": {
                "phase": "Running",
                "console": {"endpoint": f"tcp://127.0.0.1:{backend_port}"},
            },
        }
        for i in range(KEPT)
    ]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump_all(docs))
    tmp.replace(path)  # the server re-reads a standalone file when it changes


async def fill(server: Server, name: str, data: bytes) -> None:
    """Send `data` through console `name` as its writer and read the echo back."""
    async with server.target.connect(name, V5, server.target.ssl_context(), 30) as ws:
        await ws.recv()  # the stream is up
        await ws.send(b"\x00" + data)
        got = 0
        while got < len(data):
            message = await ws.recv()
            got += len(message) - 1 if message[:1] == b"\x01" else 0


async def kept_table(
    server: Server, http: aiohttp.ClientSession, machines: Path, backend_port: int, *, window: float
) -> str:
    """Memory and CPU of 100 kept consoles, idle and with their scrollback full."""
    before = await settle(server.pid, max_samples=20)
    kept_machines(machines, backend_port, kept=True)
    async with asyncio.timeout(120):
        # Another process: nothing to await but its next answer.
        while await server.sample(http, "subres_consoles_kept") < KEPT:  # noqa: ASYNC110
            await asyncio.sleep(0.2)
    idle = await settle(server.pid, max_samples=40)
    cpu0, wall0 = cpu_seconds(server.pid), time.monotonic()
    await asyncio.sleep(window)  # the measurement window, not synchronisation
    idle_cpu = (cpu_seconds(server.pid) - cpu0) / (time.monotonic() - wall0)
    data = os.urandom(FILL)
    full: list[dict[str, int]] = []
    for _ in range(2):  # the second round shows whether the first one's growth is bounded
        for i in range(KEPT):
            await fill(server, f"k{i}", data)
        async with asyncio.timeout(60):
            await server.wait_sessions(http, 0)
        full.append(await settle(server.pid, max_samples=40))
    lines = [
        f"### {KEPT} kept consoles (each: one backend connection, one task, a 64 KiB "
        "scrollback at most)",
        "",
        f"Baseline: {KEPT} machines, none kept: Rss {before['Rss'] / 1024:.1f} MiB.",
        "",
        "| state | server Rss MiB | KiB/console Rss | KiB/console Pss | KiB/console Anonymous "
        "| server CPU % of a core |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for label, mem, load in (
        ("kept, idle, scrollback empty", idle, f"{100 * idle_cpu:.2f}"),
        (f"kept, {FILL // 1024} KiB through each (scrollback full)", full[0], "—"),
        (f"kept, {FILL // 1024} KiB more through each", full[1], "—"),
    ):
        per = {k: (mem[k] - before[k]) / KEPT for k in before}
        lines.append(
            f"| {label} | {mem['Rss'] / 1024:.1f} | {per['Rss']:.1f} | {per['Pss']:.1f} "
            f"| {per['Anonymous']:.1f} | {load} |"
        )
    return "\n".join(lines)
