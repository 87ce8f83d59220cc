"""Connection benchmark: what stuck connections cost the server, and that it gets it back.

Run from the checkout: `python -m tests.bench.bench_connections [--quick]`.
It prints one markdown table: for each kind of stuck client (TCP that never
starts TLS, idle TLS, slowloris, idle keep-alive after one request), `--clients`
of them (1000; quick 100) are opened against a `subres serve` process whose
timeouts are `--timeout` seconds (10; quick 3). With all of them open, the
server's descriptors and RSS are read; then, once the server has closed every
one, again. A row says what each connection cost while it was open and how
much of the memory came back.

The server is its own process on 127.0.0.1, stopped by PID at the end; the
temp dir is removed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import secrets
import ssl
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from subres.serving import certs
from tests import stuck_clients as stuck
from tests.bench.procs import Child, bench_header, bench_main, serve_standalone

__all__ = ["main"]

SETTLE_SECONDS = 3.0
AFTER_SECONDS = 12.0
"""How long RSS is watched after the last close: the server's periodic memory check
(every 10 s) is what notices connections that never finished their handshake."""
OPENING = 100
"""Connections being opened at once."""


@dataclass(frozen=True)
class Settings:
    """What one run measures."""

    clients: int
    timeout: float


def parse(argv: Sequence[str] | None) -> Settings:
    """Settings from the command line; --quick lowers the defaults."""
    p = argparse.ArgumentParser(prog="python -m tests.bench.bench_connections", description=__doc__)
    p.add_argument("--quick", action="store_true", help="100 clients, 3 s timeouts")
    p.add_argument("--clients", type=int, help="stuck clients of each kind (1000; quick 100)")
    p.add_argument("--timeout", type=float, help="the server's timeouts, seconds (10; quick 3)")
    ns = p.parse_args(argv)
    return Settings(
        clients=ns.clients or (100 if ns.quick else 1000),
        timeout=ns.timeout or (3.0 if ns.quick else 10.0),
    )


@dataclass(frozen=True)
class Server:
    """The running server."""

    child: Child
    port: int
    tls: ssl.SSLContext


async def start(root: Path, settings: Settings) -> Server:
    """`subres serve --standalone` with the timeouts under test."""
    certs.ensure_self_signed(root / "certs", service="subres", namespace="subres-system")
    (root / "tokens.csv").write_text(f'{secrets.token_urlsafe(24)},bench,bench-uid,"bench"\n')
    (root / "machines.yaml").write_text("")
    timeout = f"{settings.timeout}s"
    child, port = await serve_standalone(
        root,
        *("--tls-handshake-timeout", timeout, "--request-header-timeout", timeout),
        *("--idle-timeout", timeout, "--max-unauthenticated-connections", "100000"),
    )
    tls = ssl.create_default_context(cafile=str(root / "certs" / "ca.crt"))
    return Server(child, port, tls)


def fds(pid: int) -> int:
    """Descriptors `pid` holds."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_kib(pid: int) -> int:
    """VmRSS of `pid`."""
    found = re.search(r"^VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.M)
    assert found is not None
    return int(found.group(1))


async def lowest_rss(pid: int, seconds: float) -> int:
    """The lowest RSS over `seconds`: memory freed a little late still counts as freed."""
    lowest, deadline = rss_kib(pid), time.monotonic() + seconds
    while time.monotonic() < deadline:
        await asyncio.sleep(0.25)
        lowest = min(lowest, rss_kib(pid))
    return lowest


Kind = Callable[[Server], Awaitable[stuck.Stuck]]


def kinds(settings: Settings) -> dict[str, Kind]:
    """The stuck clients, by the name their row gets."""
    every = settings.timeout / 4
    return {
        "TCP, never starts TLS": lambda s: stuck.no_handshake(s.port),
        "idle TLS, no request": lambda s: stuck.idle_tls(s.port, s.tls),
        "slowloris (a header line every timeout/4)": lambda s: stuck.slowloris(
            s.port, s.tls, every=every
        ),
        "keep-alive, idle after one request": lambda s: stuck.keepalive_after_one_request(
            s.port, s.tls
        ),
    }


async def row(server: Server, settings: Settings, name: str, kind: Kind) -> str:
    """Open `settings.clients` of one kind, measure with all open and after the reaping."""
    pid = server.child.pid
    fds0, rss0 = fds(pid), await lowest_rss(pid, SETTLE_SECONDS)
    opening = asyncio.Semaphore(OPENING)
    opened: list[stuck.Stuck] = []
    all_open = asyncio.Event()

    async def one() -> None:
        async with opening:
            connection = await kind(server)
        opened.append(connection)
        if len(opened) == settings.clients:
            all_open.set()
        await connection.closed_by_server()

    began = time.monotonic()
    clients = asyncio.gather(*(one() for _ in range(settings.clients)))
    async with asyncio.timeout(settings.timeout * 10 + 120):
        await all_open.wait()
        peak_fds, peak_rss = fds(pid), rss_kib(pid)
        await clients
    reaped = time.monotonic() - began
    fds1, rss1 = fds(pid), await lowest_rss(pid, AFTER_SECONDS)
    per = (peak_rss - rss0) / settings.clients
    return (
        f"| {name} | {peak_fds - fds0} | {per:.1f} | {rss0 / 1024:.0f} | {peak_rss / 1024:.0f} "
        f"| {reaped:.1f} | {fds1 - fds0} | {rss1 / 1024:.0f} | {(rss1 - rss0) / 1024:+.1f} |"
    )


async def warm_up(server: Server, settings: Settings) -> None:
    """A few of every kind first, so the first row does not pay one-time costs."""
    async with asyncio.timeout(settings.timeout * 4 + 60):
        opened = [await kind(server) for kind in kinds(settings).values() for _ in range(20)]
        await asyncio.gather(*(c.closed_by_server() for c in opened))


def header(argv: Sequence[str], settings: Settings) -> str:
    """What was run, where, with what."""
    return bench_header(
        "subres connection benchmark",
        "tests.bench.bench_connections",
        argv,
        f"{settings.clients} clients of each kind; server timeouts {settings.timeout:g}s",
    )


async def run(settings: Settings, argv: Sequence[str]) -> None:
    """Start the server, measure every kind, stop the server."""
    print(header(argv, settings), flush=True)
    with tempfile.TemporaryDirectory(prefix="subres-bench-conn-") as tmp:
        server = await start(Path(tmp), settings)
        try:
            print(
                "\n".join(
                    [
                        "",
                        "### Stuck connections: cost while open, and what comes back",
                        "",
                        "| client | server fds while open | KiB each | RSS before MiB "
                        "| RSS open MiB | all closed after s | fds left | RSS after MiB "
                        "| after - before MiB |",
                        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
                    ]
                ),
                flush=True,
            )
            await warm_up(server, settings)
            for name, kind in kinds(settings).items():
                print(await row(server, settings, name, kind), flush=True)
        finally:
            await server.child.stop()


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point."""
    bench_main(run, parse, argv)


if __name__ == "__main__":
    main()
