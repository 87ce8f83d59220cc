"""Display recording benchmark: what recording a display costs its server and its viewer.

Run from the checkout: `python -m tests.bench.bench_display_recording [--seconds S]
[--displays clock,qemu]`. For each display, an interactive viewer (an RFB
client over the vnc WebSocket, always one update request outstanding, as
noVNC keeps one) watches for `--seconds`, once on a Machine that is not
recorded and once on one that is (the same display). It prints one markdown
table: the server's CPU per viewer-minute and as a share of a core, the
share the recording adds, the recording's size per minute, and the viewer's
latency (from a change of the picture to the update that shows it; p50, p90)
with what the recording adds to the median.

- `clock`: the demo's display (640x400, its clock), run in this process,
  its clock moved on every `CHANGE` seconds: the changes are timed, so its
  row has the latency.
- `qemu`: examples/qemu-vm booted by its own script (QEMU, TCG unless KVM
  works), its VGA console scrolling: the serial shell prints a line to tty1
  ten times a second. The picture's changes are not ours to time, so the
  row has no latency.

The server (`python -m subres serve`, standalone) is a separate process;
the VM is stopped by PID and the temp dir removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import secrets
import ssl
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import websockets
import yaml
from websockets.asyncio.client import ClientConnection, connect

from subres.demo.vnc import Display, VncServer
from subres.protocol.rfbwatch import Changed, FrameReady, WatchClient
from subres.serving import certs
from tests.bench import bench_screenshot
from tests.bench.procs import bench_header, bench_main, cpu_seconds, serve_standalone
from tests.support import free_port

__all__ = ["main"]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "qemu-vm"
CHANGE = 0.2
"""Seconds between the clock display's changes."""
START_TIMEOUT = 300.0
"""Seconds the VM may take to be fetched, built and booted on a cold machine."""
RECORD = {"subres.dev/record-display": "true"}


@dataclass(frozen=True)
class Settings:
    """What one run measures."""

    seconds: float
    displays: tuple[str, ...]


def parse(argv: Sequence[str] | None) -> Settings:
    """Settings from the command line."""
    p = argparse.ArgumentParser(
        prog="python -m tests.bench.bench_display_recording", description=__doc__
    )
    p.add_argument("--seconds", type=float, default=60.0, help="each viewer's time (60)")
    p.add_argument("--displays", default="clock,qemu", help="clock, qemu, or both (default)")
    ns = p.parse_args(argv)
    displays = tuple(d for d in ns.displays.split(",") if d)
    if not set(displays) <= {"clock", "qemu"}:
        p.error("--displays takes clock and qemu")
    return Settings(seconds=ns.seconds, displays=displays)


@dataclass(frozen=True)
class Server(bench_screenshot.Server):
    """The running server, what a client needs, and where it records."""

    recordings: Path

    def url(self, machine: str) -> str:
        path = "/apis/subresources.subres.dev/v1alpha1/namespaces/default/machines"
        return f"wss://127.0.0.1:{self.port}{path}/{machine}/vnc"


async def start_server(root: Path, endpoint: str, socket_dir: Path) -> Server:
    """A server with the display as two Machines: `plain` and `recorded`."""
    certs.ensure_self_signed(root / "certs", service="subres", namespace="subres-system")
    token = secrets.token_urlsafe(24)
    (root / "tokens.csv").write_text(f'{token},bench,bench-uid,"bench"\n')
    config = {
        "endpointPolicy": {
            "schemes": ["unix"],
            "socketDirs": [str(socket_dir)],
        },
        "consoles": {"recordings": {"directory": str(root / "recordings")}},
    }
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    machines = [machine("plain", endpoint, {}), machine("recorded", endpoint, RECORD)]
    (root / "machines.yaml").write_text(yaml.safe_dump_all(machines))
    child, port = await serve_standalone(root, "--config", str(root / "config.yaml"))
    tls = ssl.create_default_context(cafile=str(root / "certs" / "ca.crt"))
    return Server(child, port, token, tls, root / "recordings")


def machine(name: str, endpoint: str, annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "subres.dev/v1alpha1",
        "kind": "Machine",
        "metadata": {"name": name, "namespace": "default", "annotations": annotations},
        "status": {"phase": "Running", "vnc": {"endpoint": endpoint}},
    }


class Viewer:
    """An interactive viewer: one incremental request always outstanding, updates timed."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.client = WatchClient()
        self.updates: list[float] = []

    async def run(self) -> None:
        """Read updates until cancelled."""
        while True:
            if out := self.client.data_to_send():
                await self.ws.send(out)
            message = await self.ws.recv()
            assert isinstance(message, bytes)
            for event in self.client.receive_data(message):
                if isinstance(event, FrameReady | Changed):
                    self.updates.append(time.monotonic())
                    self.client.request()


@dataclass(frozen=True)
class Run:
    """One viewer's time on one Machine."""

    cpu_per_minute: float
    bytes_per_minute: float
    latencies: list[float]


async def view(server: Server, name: str, seconds: float, changes: list[float]) -> Run:
    """A viewer on Machine `name` for `seconds`; `changes` fills with when the picture changed
    (when this process changes it)."""
    before_files = set(server.recordings.rglob("*.display"))
    cpu = cpu_seconds(server.child.pid)
    headers = {"Authorization": f"Bearer {server.token}"}
    async with connect(
        server.url(name),
        ssl=server.tls,
        additional_headers=headers,
        subprotocols=[websockets.Subprotocol("binary")],
        max_size=None,
        compression=None,
    ) as ws:
        viewer = Viewer(ws)
        reading = asyncio.create_task(viewer.run())
        started = time.monotonic()
        del changes[:]
        await asyncio.sleep(seconds)  # the viewer's time on the display: what is measured
        reading.cancel()
        await asyncio.wait([reading])
        elapsed = time.monotonic() - started
    used = cpu_seconds(server.child.pid) - cpu
    await asyncio.sleep(1.0)  # the recording's last flush
    size = sum(p.stat().st_size for p in set(server.recordings.rglob("*.display")) - before_files)
    minutes = elapsed / 60
    return Run(used / minutes, size / minutes, latencies(changes, viewer.updates))


def latencies(changes: list[float], updates: list[float]) -> list[float]:
    """For each change, the time to the first update after it (seconds)."""
    found = []
    for change in changes:
        after = next((u for u in updates if u >= change), None)
        if after is not None:
            found.append(after - change)
    return found


@contextlib.asynccontextmanager
async def clock_display(root: Path, changes: list[float]) -> AsyncIterator[tuple[str, Path]]:
    """The demo display, its clock moved on every `CHANGE` seconds, each change noted."""
    ticks = [0]
    server = VncServer(root / "vnc.sock", display=Display(clock=lambda: f"{ticks[0]:08}"))
    await server.start()

    async def move() -> None:
        while True:
            await asyncio.sleep(CHANGE)  # the display's own pace
            ticks[0] += 1
            server.display.tick()
            changes.append(time.monotonic())

    mover = asyncio.create_task(move())
    try:
        yield f"unix://{server.path}", root
    finally:
        mover.cancel()
        await asyncio.wait([mover])
        await server.stop()


@contextlib.asynccontextmanager
async def qemu_display(root: Path) -> AsyncIterator[tuple[str, Path]]:
    """examples/qemu-vm, booted; its VGA console scrolling."""
    state = root / "vm"
    await script("start", str(state), str(free_port()))
    try:
        await scroll(state / "serial.sock")
        yield f"unix://{state / 'vnc.sock'}", state
    finally:
        await script("stop", str(state))  # by the PID it wrote


async def script(*args: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        "bash", str(EXAMPLE / "run-vm.sh"), *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    async with asyncio.timeout(START_TIMEOUT):
        out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"run-vm.sh {args[0]} failed: {out.decode(errors='replace')[-2000:]}")


async def scroll(serial: Path) -> None:
    """Wait for the VM's serial shell, then have it print to tty1 ten times a second."""
    reader, writer = await asyncio.open_unix_connection(str(serial))
    try:
        seen = b""
        async with asyncio.timeout(START_TIMEOUT):
            while b"# " not in seen:
                writer.write(b"\r")
                await writer.drain()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(2):
                        seen += await reader.read(65536)
            writer.write(b"(while :; do date; cat /proc/loadavg; sleep 0.1; done >/dev/tty1 &)\r")
            await writer.drain()
    finally:
        writer.close()


def row(display: str, plain: Run, recorded: Run) -> str:
    """The table's row for one display."""
    share = [run.cpu_per_minute / 60 * 100 for run in (plain, recorded)]
    cells = [
        display,
        f"{plain.cpu_per_minute:.2f}",
        f"{recorded.cpu_per_minute:.2f}",
        f"{share[0]:.1f}",
        f"{share[1]:.1f}",
        f"{share[1] - share[0]:.1f}",
        f"{recorded.bytes_per_minute / 1024:.0f}",
    ]
    if plain.latencies and recorded.latencies:
        p50 = [statistics.median(run.latencies) * 1000 for run in (plain, recorded)]
        p90 = [quantile(run.latencies, 0.9) * 1000 for run in (plain, recorded)]
        cells += [f"{p50[0]:.1f} / {p90[0]:.1f}", f"{p50[1]:.1f} / {p90[1]:.1f}"]
        cells.append(f"{(p50[1] - p50[0]) / p50[0] * 100:+.0f}")
    else:
        cells += ["-", "-", "-"]
    return "| " + " | ".join(cells) + " |"


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(display: str, settings: Settings) -> str:
    """Both viewers on one display; its row."""
    changes: list[float] = []
    with tempfile.TemporaryDirectory(prefix="subres-bench-display-") as tmp:
        root = Path(tmp)
        source = clock_display(root, changes) if display == "clock" else qemu_display(root)
        async with source as (endpoint, socket_dir):
            server = await start_server(root, endpoint, socket_dir)
            try:
                await view(server, "plain", min(settings.seconds, 2.0), changes)  # warm-up
                plain = await view(server, "plain", settings.seconds, changes)
                recorded = await view(server, "recorded", settings.seconds, changes)
            finally:
                await server.child.stop()
    return row(display, plain, recorded)


def header(argv: Sequence[str], settings: Settings) -> str:
    return bench_header(
        "subres display recording benchmark",
        "tests.bench.bench_display_recording",
        argv,
        f"{settings.seconds:g} s per viewer; recordings at the default displayRate (4/s)",
    )


async def run(settings: Settings, argv: Sequence[str]) -> None:
    """Measure each display, print the table."""
    print(header(argv, settings), flush=True)
    lines = [
        "",
        "### What recording a display costs",
        "",
        "| display | server CPU s / viewer-min | recorded | % of a core | recorded "
        "| added by the recording | recording KiB / min | viewer latency p50 / p90 ms "
        "| recorded | added to p50 % |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    print("\n".join(lines), flush=True)
    for display in settings.displays:
        print(await measure(display, settings), flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point."""
    bench_main(run, parse, argv)


if __name__ == "__main__":
    main()
