"""Screenshot benchmark: the server's peak memory while capturing large framebuffers.

Run from the checkout: `python -m tests.bench.bench_screenshot [--quick]`.
It prints one markdown table: for each count of screenshots requested at
once, of a `--size` framebuffer (4096x4096, the default pixel cap), the
server's RSS before, its peak during (VmHWM, reset before each row through
`/proc/PID/clear_refs`), its RSS shortly after, and the wall time until every
PNG arrived (each is decoded and its size checked).

The VNC server (`vnc_backend.py`) and the server (`python -m subres serve`,
standalone) are separate processes on a unix socket and 127.0.0.1; both are
stopped by PID at the end, and the temp dir is removed.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import re
import secrets
import ssl
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import yaml
from PIL import Image

from subres.serving import certs
from tests.bench.procs import Child, bench_header, bench_main, serve_standalone, spawn

__all__ = ["main"]

START_TIMEOUT = 60.0
SHOT_TIMEOUT = 120.0
"""Seconds a row's screenshots may take on a loaded 2-core machine."""
SETTLE_SECONDS = 2.0
"""How long to watch RSS after a row before reporting it."""


@dataclass(frozen=True)
class Settings:
    """What one run measures."""

    width: int
    height: int
    counts: tuple[int, ...]
    server_config: dict[str, int]


def parse(argv: Sequence[str] | None) -> Settings:
    """Settings from the command line; --quick lowers the defaults."""
    p = argparse.ArgumentParser(prog="python -m tests.bench.bench_screenshot", description=__doc__)
    p.add_argument("--quick", action="store_true", help="a 1024x1024 display, 1 and 2 at once")
    p.add_argument("--size", help="framebuffer WIDTHxHEIGHT (4096x4096; quick 1024x1024)")
    p.add_argument("--counts", help="screenshots at once, comma-separated (1,2,4,8; quick 1,2)")
    p.add_argument(
        "--server-config",
        action="append",
        default=[],
        metavar="KEY=N",
        help="a `session` setting of the server, e.g. screenshotConcurrency=4 (repeatable)",
    )
    ns = p.parse_args(argv)
    size = ns.size or ("1024x1024" if ns.quick else "4096x4096")
    width, height = (int(n) for n in size.split("x"))
    counts = ns.counts or ("1,2" if ns.quick else "1,2,4,8")
    return Settings(
        width=width,
        height=height,
        counts=tuple(int(n) for n in counts.split(",")),
        server_config={k: int(v) for k, v in (kv.split("=", 1) for kv in ns.server_config)},
    )


@dataclass(frozen=True)
class Server:
    """The running server and what a client needs."""

    child: Child
    port: int
    token: str
    tls: ssl.SSLContext


async def start(root: Path, settings: Settings) -> tuple[Child, Server]:
    """The VNC backend and the server, both running."""
    socket = root / "vnc.sock"
    vnc = await spawn(
        "vnc backend",
        "tests.bench.vnc_backend",
        *("--socket", str(socket), "--width", str(settings.width)),
        *("--height", str(settings.height)),
    )
    async with asyncio.timeout(START_TIMEOUT):
        await vnc.expect("ready")
    certs.ensure_self_signed(root / "certs", service="subres", namespace="subres-system")
    token = secrets.token_urlsafe(24)
    (root / "tokens.csv").write_text(f'{token},bench,bench-uid,"bench"\n')
    config = {
        "endpointPolicy": {"schemes": ["unix"], "socketDirs": [str(root)]},
        "session": {"screenshotTimeout": SHOT_TIMEOUT, **settings.server_config},
    }
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    machine = {
        "apiVersion": "subres.dev/v1alpha1",
        "kind": "Machine",
        "metadata": {"name": "big", "namespace": "default"},
        "status": {"phase": "Running", "vnc": {"endpoint": f"unix://{socket}"}},
    }
    (root / "machines.yaml").write_text(yaml.safe_dump(machine))
    child, port = await serve_standalone(root, "--config", str(root / "config.yaml"))
    tls = ssl.create_default_context(cafile=str(root / "certs" / "ca.crt"))
    return vnc, Server(child, port, token, tls)


def status_kib(pid: int, field: str) -> int:
    """A `/proc/PID/status` figure in KiB (VmRSS, VmHWM)."""
    text = Path(f"/proc/{pid}/status").read_text()
    found = re.search(rf"^{field}:\s+(\d+) kB", text, re.MULTILINE)
    assert found is not None, field
    return int(found.group(1))


def reset_peak(pid: int) -> None:
    """Reset the process's VmHWM to its current RSS."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


async def settled_rss(pid: int, seconds: float) -> int:
    """The lowest RSS seen over `seconds` (memory freed late still counts as freed)."""
    lowest = status_kib(pid, "VmRSS")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        lowest = min(lowest, status_kib(pid, "VmRSS"))
    return lowest


async def shoot(http: aiohttp.ClientSession, server: Server, settings: Settings) -> None:
    """One screenshot, decoded and checked."""
    url = f"https://127.0.0.1:{server.port}/apis/subresources.subres.dev/v1alpha1"
    url += "/namespaces/default/machines/big/screenshot"
    headers = {"Authorization": f"Bearer {server.token}"}
    async with http.get(url, headers=headers, ssl=server.tls) as response:
        body = await response.read()
        if response.status != 200:
            raise RuntimeError(f"screenshot answered {response.status}: {body[:300]!r}")
    with Image.open(io.BytesIO(body)) as image:
        assert image.size == (settings.width, settings.height), image.size


async def row(http: aiohttp.ClientSession, server: Server, settings: Settings, count: int) -> str:
    """Measure `count` screenshots at once."""
    pid = server.child.pid
    before = await settled_rss(pid, SETTLE_SECONDS)
    reset_peak(pid)
    started = time.perf_counter()
    async with asyncio.timeout(SHOT_TIMEOUT):
        await asyncio.gather(*(shoot(http, server, settings) for _ in range(count)))
    elapsed = time.perf_counter() - started
    peak = status_kib(pid, "VmHWM")
    after = await settled_rss(pid, SETTLE_SECONDS)
    mib = [f"{kib / 1024:.0f}" for kib in (before, peak, peak - before, after, after - before)]
    return f"| {count} | {elapsed:.1f} | " + " | ".join(mib) + " |"


def header(argv: Sequence[str], settings: Settings) -> str:
    """What was run, where, with what."""
    return bench_header(
        "subres screenshot benchmark",
        "tests.bench.bench_screenshot",
        argv,
        f"framebuffer {settings.width}x{settings.height} (the demo display), server "
        f"session settings: {settings.server_config or 'defaults'}",
    )


async def run(settings: Settings, argv: Sequence[str]) -> None:
    """Start everything, measure every row, stop everything."""
    print(header(argv, settings), flush=True)
    with tempfile.TemporaryDirectory(prefix="subres-bench-shot-") as tmp:
        vnc, server = await start(Path(tmp), settings)
        try:
            timeout = aiohttp.ClientTimeout(total=SHOT_TIMEOUT)
            async with aiohttp.ClientSession(timeout=timeout) as http:
                await shoot(http, server, settings)  # warm-up: imports, first allocations
                lines = [
                    "",
                    "### Server memory during concurrent screenshots (MiB)",
                    "",
                    "| at once | s | RSS before | peak RSS | peak - before | RSS after "
                    "| after - before |",
                    "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
                ]
                print("\n".join(lines), flush=True)
                for count in settings.counts:
                    print(await row(http, server, settings, count), flush=True)
        finally:
            await server.child.stop()
            await vnc.stop()


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point."""
    bench_main(run, parse, argv)


if __name__ == "__main__":
    main()
