"""Session Lease benchmark: how fast replicas agree, and what it costs the apiserver.

Run from the checkout: `python -m tests.bench.bench_leases [--duration 30 --renew 10]`.
It starts a real etcd and kube-apiserver (`tests/e2e/controlplane.py`),
deploys subres from `deploy/` and runs two replicas with the given Lease
duration and renew interval: A behind the APIService, B beside it, reached
with kube-apiserver's front-proxy certificate (as `tests/e2e/test_replicas.py`
does). Then it prints markdown tables:

1. Takeover: from the moment a new console session is requested to the
   moment the old session's client receives its close frame (4001), when the
   old session is on the other replica (through kube-apiserver to A, new one
   at B: the Lease write, B's upgrade, A's watch) and on the same replica
   (both through A); also from the new session's 101 to that close.
2. Lease writes per live session: the writes an admin watch of one idle
   session's Lease sees over `--window` seconds.
3. A dead replica: from SIGKILL of the replica holding a vnc session (its
   Lease left behind), at a random point of its renewal cycle, to the first
   `preserveSession=true` request through the other replica that succeeds,
   polled every 100 ms; beside it, how long before the kill the Lease was
   last written (its `renewTime`, same machine clock) and so the expected
   block: the duration less that.

Every process is started and stopped by PID; every wait is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import random
import shlex
import signal
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from websockets.exceptions import ConnectionClosed, InvalidStatus

from subres.sessions.leases import lease_name
from subres.sessions.registry import SessionKey
from tests.e2e import controlplane, subresserver
from tests.e2e.controlplane import ControlPlane
from tests.e2e.subresserver import Profile, Subres
from tests.e2e.test_replicas import at_b, bind_users
from tests.e2e.test_subres import NS, Route, console, echoed, put_machine, via_apiserver
from tests.e2e.test_subres import wait_served as wait_console
from tests.support import Backend

__all__ = ["main"]

MACHINE = "bench-lease"
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{subresserver.NAMESPACE}/leases"
CLOSE_TIMEOUT = 30.0
"""Seconds a takeover's close may take to reach the old client."""
POLL = 0.1
"""Seconds between preserveSession attempts while a dead replica's Lease blocks them."""


@dataclass(frozen=True)
class Settings:
    """What one run measures."""

    duration: int
    renew: float
    takeovers: int
    window: float
    expiries: int


def parse(argv: Sequence[str]) -> Settings:
    """Settings from the command line."""
    parser = argparse.ArgumentParser(prog="python -m tests.bench.bench_leases")
    parser.add_argument("--duration", type=int, default=30, help="--lease-duration, seconds")
    parser.add_argument("--renew", type=float, default=10.0, help="--lease-renew-interval")
    parser.add_argument("--takeovers", type=int, default=30, help="takeovers timed per row")
    parser.add_argument("--window", type=float, default=60.0, help="seconds writes are counted")
    parser.add_argument("--expiries", type=int, default=3, help="replicas killed, one by one")
    ns = parser.parse_args(argv)
    return Settings(ns.duration, ns.renew, ns.takeovers, ns.window, ns.expiries)


@dataclass
class Pair:
    """The control plane, the two replicas and the routes to them."""

    plane: ControlPlane
    a: Subres
    b: Subres
    alice: Route
    """Through kube-apiserver: replica A."""

    def at_b(self, user: str) -> Route:
        return at_b(self.plane, self.b, user)


# --- 1. takeover -------------------------------------------------------------------------


async def takeover(old_route: Route, new_route: Route) -> tuple[float, float]:
    """Seconds from the new session's request, and from its 101, to the old one's 4001."""
    loop = asyncio.get_running_loop()
    async with console(old_route, MACHINE) as old:
        await echoed(old, b"held")
        requested = loop.time()
        async with console(new_route, MACHINE):
            upgraded = loop.time()
            try:
                async with asyncio.timeout(CLOSE_TIMEOUT):
                    while True:
                        await old.recv()
            except ConnectionClosed:
                closed = loop.time()
            if old.close_code != 4001:
                raise RuntimeError(f"old session closed with {old.close_code} {old.close_reason}")
    return closed - requested, closed - upgraded


async def takeover_table(pair: Pair, settings: Settings) -> str:
    rows = []
    for label, new_route in (
        ("other replica (through kube-apiserver to A, then at B)", pair.at_b("bob")),
        ("same replica (both through kube-apiserver to A)", pair.alice),
    ):
        samples = [await takeover(pair.alice, new_route) for _ in range(settings.takeovers)]
        requested = [s[0] * 1000 for s in samples]
        after_101 = [s[1] * 1000 for s in samples]
        rows.append(
            f"| {label} | {len(samples)} | {_p(requested, 50):.1f} | {_p(requested, 90):.1f} | "
            f"{max(requested):.1f} | {_p(after_101, 50):.1f} | {max(after_101):.1f} |"
        )
    return "\n".join(
        [
            "### Takeover: old session closed (4001)",
            "",
            "| old session on | n | ms from request p50 | p90 | max | ms from 101 p50 | max |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
            *rows,
        ]
    )


# --- 2. writes ----------------------------------------------------------------------------


async def writes_table(pair: Pair, settings: Settings) -> str:
    """Watch one idle session's Lease for the window: every write is an event."""
    name = lease_name(SessionKey("machines", "console", NS, MACHINE))
    events: list[str] = []
    async with console(pair.alice, MACHINE) as ws:
        await echoed(ws, b"idle from now")
        await _watch(pair.plane, name, events, settings.window)
    renewals = events.count("MODIFIED")
    return "\n".join(
        [
            "### Lease writes per live session",
            "",
            "| renew interval s | window s | renewals seen | per minute | "
            "writes per session besides renewals |",
            "| ---: | ---: | ---: | ---: | --- |",
            f"| {settings.renew:g} | {settings.window:g} | {renewals} | "
            f"{renewals * 60 / settings.window:.1f} | 1 create or replace (claim), "
            "1 delete (end) |",
        ]
    )


async def _watch(plane: ControlPlane, name: str, events: list[str], seconds: float) -> None:
    """Collect the types of watch events on Lease `name` for `seconds`."""
    params = {"watch": "1", "fieldSelector": f"metadata.name={name}"}
    current = await plane.api("GET", f"{LEASES}/{name}")
    params["resourceVersion"] = current["metadata"]["resourceVersion"]
    timeout = aiohttp.ClientTimeout(total=seconds + 30)
    async with (
        aiohttp.ClientSession(timeout=timeout) as http,
        http.get(plane.url + LEASES, params=params, ssl=plane.admin_ssl_context()) as response,
    ):
        response.raise_for_status()
        try:
            async with asyncio.timeout(seconds):
                async for line in response.content:
                    if line.strip():
                        events.append(json.loads(line)["type"])
        except TimeoutError:
            pass


# --- 3. a dead replica --------------------------------------------------------------------


async def expiry(pair: Pair, settings: Settings) -> tuple[float, float]:
    """Seconds since B last wrote its Lease when it was killed, and until preserve succeeded."""
    loop = asyncio.get_running_loop()
    await wait_console(pair.at_b("alice"), MACHINE)
    async with console(pair.at_b("alice"), MACHINE, sub="vnc") as held:
        await echoed(held, b"about to die")
        # The scenario, not a synchronisation: die at a random point of the renewal cycle.
        await asyncio.sleep(random.uniform(0, settings.renew))
        assert pair.b.process.popen is not None
        pair.b.process.popen.send_signal(signal.SIGKILL)
        killed, killed_at = loop.time(), time.time()
        await pair.b.stop()
    name = lease_name(SessionKey("machines", "vnc", NS, MACHINE))
    left = await pair.plane.api("GET", f"{LEASES}/{name}")
    renewed = datetime.datetime.fromisoformat(left["spec"]["renewTime"]).timestamp()
    async with asyncio.timeout(settings.duration * 2 + 60):
        while True:
            try:
                async with console(pair.alice, MACHINE, sub="vnc", query="?preserveSession=true"):
                    return killed_at - renewed, loop.time() - killed
            except InvalidStatus as exc:
                if exc.response.status_code != 409:
                    raise
            await asyncio.sleep(POLL)


async def expiry_table(pair: Pair, settings: Settings) -> str:
    samples = []
    for _ in range(settings.expiries):
        samples.append(await expiry(pair, settings))
        pair.b = await subresserver.replica(pair.a, "replica-b")
    rows = [
        f"| {settings.duration} | {settings.renew:g} | {since:.1f} | "
        f"{settings.duration - since:.1f} | {blocked:.1f} |"
        for since, blocked in samples
    ]
    return "\n".join(
        [
            "### A dead replica's Lease blocks preserveSession",
            "",
            "| lease duration s | renew s | killed s after its last write | "
            "expected block s | measured block s |",
            "| ---: | ---: | ---: | ---: | ---: |",
            *rows,
        ]
    )


# --- the run -------------------------------------------------------------------------------


def _p(values: list[float], percent: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[percent - 1]


def header(argv: Sequence[str]) -> str:
    # Every bench prints this block (rerun, machine, setup) in the same shape; its lines differ.
    command = " ".join(["python -m tests.bench.bench_leases", *map(shlex.quote, argv)])
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return "\n".join(
        [
            "## subres session Lease benchmark",
            "",
            f"- rerun: `cd {Path(__file__).resolve().parents[2]} && {command}`",
            f"- machine: nproc {os.cpu_count()}, load average {load} at start, "
            f"{platform.platform()}, Python {platform.python_version()}",
            "- a real etcd (no fsync) and kube-apiserver on 127.0.0.1; two `subres serve` "
            "processes; clients through kube-apiserver (A) and with the front-proxy "
            "certificate (B)",
            "- the cores are shared with other work: treat numbers as noisy",
        ]
    )


def emit(text: str) -> None:
    print(text + "\n", flush=True)


async def run(settings: Settings, argv: Sequence[str]) -> None:
    emit(header(argv))
    flags = (
        f"--lease-duration={settings.duration}s",
        f"--lease-renew-interval={settings.renew:g}s",
        "--replica-name=replica-a",
    )
    backend = await Backend().start_tcp()
    try:
        async with controlplane.start_control_plane() as plane:
            a = await subresserver.launch(plane, Profile(args=flags))
            try:
                b = await subresserver.replica(a, "replica-b")
                pair = Pair(plane, a, b, via_apiserver(plane, "alice"))
                try:
                    await bind_users(plane)
                    await put_machine(plane, MACHINE, console=backend.url, vnc=backend.url)
                    await wait_console(pair.alice, MACHINE)
                    await wait_console(pair.at_b("bob"), MACHINE)
                    if settings.takeovers:
                        emit(await takeover_table(pair, settings))
                    if settings.window:
                        emit(await writes_table(pair, settings))
                    if settings.expiries:
                        emit(await expiry_table(pair, settings))
                finally:
                    await pair.b.stop()
            finally:
                await subresserver.shutdown(a)
    finally:
        await backend.stop()


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point."""
    args = list(sys.argv[1:] if argv is None else argv)
    asyncio.run(run(parse(args), args))


if __name__ == "__main__":
    main()
