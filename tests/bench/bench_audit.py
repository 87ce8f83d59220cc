"""Audit sink benchmark: session audit events per second into a webhook, and what they cost.

Run from the checkout: `python -m tests.bench.bench_audit [--events N]`.
Events go the way a replica sends them: the audit writer's thread builds the
CloudEvent and spools it on disk (`sessions.auditsink`), the sender posts the
batches to a sink on 127.0.0.1 (aiohttp, answering 204). Two rows: the sink up
all along, and the sink down while every event is spooled, then up (the
backlog drained). Figures: events per second end to end and the process's
CPU per 1,000 events (this process runs both the sender and the sink, so the
sender's share is lower).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from aiohttp import web

from subres.serving.metrics import Metrics
from subres.sessions.audit import SessionAudit
from subres.sessions.auditsink import SinkSettings, WebhookSink
from tests.bench.procs import bench_header, bench_main

DEADLINE = 300.0
FIELDS = {
    "subresource": "console",
    "mode": "writer",
    "dialect": "v5.channel.k8s.io",
    "kind": "Machine",
    "namespace": "default",
    "name": "vm1",
    "user": "alice",
    "groups": ["devs", "system:authenticated"],
    "start": 1.7e9,
    "end": 1.7e9 + 312.0,
    "bytesUp": 312,
    "bytesDown": 1258291,
}


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    return parser.parse_args(argv)


async def _sink(taken: list[int], port: int = 0) -> web.AppRunner:
    """A sink on 127.0.0.1 (on `port`, or any) that counts the events it takes."""

    async def take(request: web.Request) -> web.Response:
        taken[0] += (await request.read()).count(b'"specversion"')
        return web.Response(status=204)

    app = web.Application(client_max_size=4 << 20)
    app.router.add_post("/", take)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, reuse_address=True).start()
    return runner


async def _until(done: Callable[[], bool]) -> None:
    async with asyncio.timeout(DEADLINE):
        while not done():  # noqa: ASYNC110 - a bench's progress, polled
            await asyncio.sleep(0.01)


async def _row(name: str, events: int, *, down_first: bool) -> str:
    taken = [0]
    runner = await _sink(taken)
    port = int(runner.addresses[0][1])
    with tempfile.TemporaryDirectory() as scratch:
        settings = SinkSettings(
            url=f"http://127.0.0.1:{port}/", spool=Path(scratch), max_bytes=1 << 30
        )
        sender = WebhookSink(settings, metrics=Metrics())
        audit = SessionAudit(None, sink=sender, source="subres/bench")
        if down_first:
            await runner.cleanup()
        cpu, wall = time.process_time(), time.monotonic()
        await sender.start()
        for _ in range(events):
            audit.ended(FIELDS)
        if down_first:
            await _until(lambda: sender.spool.pending >= events)
            runner = await _sink(taken, port)
        await _until(lambda: taken[0] >= events)
        wall, cpu = time.monotonic() - wall, time.process_time() - cpu
        await asyncio.to_thread(audit.close)
        await sender.close()
    await runner.cleanup()
    return f"| {name} | {events:,} | {events / wall:,.0f} | {cpu / events * 1e6:.1f} |"


async def _run(args: argparse.Namespace, argv: Sequence[str]) -> None:
    print(bench_header("Session audit events to a webhook", "tests.bench.bench_audit", argv))
    print()
    print("| sink | events | events/s end to end | CPU ms per 1,000 events |")
    print("| --- | ---: | ---: | ---: |")
    print(await _row("up all along", args.events, down_first=False), flush=True)
    print(await _row("down while spooled, then up", args.events, down_first=True), flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    bench_main(_run, _parse, argv)


if __name__ == "__main__":
    main()
