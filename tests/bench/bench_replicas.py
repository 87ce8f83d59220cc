"""Replicas at scale: what coordination costs the apiserver, and the cross-replica latencies.

Run from the checkout: `python -m tests.bench.bench_replicas [--sessions 1000,5000,10000]
[--kept 1000] [--old efc49ce]`; `--smoke` is a short run for the test suite.

It starts a real etcd and kube-apiserver (`tests/e2e/controlplane.py`),
installs subres from `deploy/` and runs three replicas: A behind the
APIService, B and C beside it (reached, as kube-apiserver reaches a replica,
with its front-proxy certificate), each with its Pod as a kubelet would
report it. Machines are created for every session and kept console, all on
one echo backend. Then, for this checkout's design and (with `--old`) the
session-Lease design of an older commit, run from a temporary `git worktree`
in the same control plane:

1. `--kept` consoles opt in to be kept; every level of `--sessions` live
   writer sessions is opened (idle, spread over the replicas) and held for
   `--window` seconds, over which it reads kube-apiserver's
   `apiserver_request_total` (writes by verb and resource: the deltas of
   create, update, patch and delete), the CPU of kube-apiserver and etcd
   (/proc), and each replica's RSS (per session: the growth since before
   the sessions, over their number).
2. Takeover: from a new writer's request to the old writer's 4001, the two
   on the same replica and on two replicas (p50 of `--samples`).
3. Observer round trip: a byte the writer sends, echoed by the backend,
   until an observer reads it, the observer on the writer's replica and on
   another one (p50); and the observer's attach (request to 101).

Every process is started and stopped by PID and every wait is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import shutil
import ssl
import statistics
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from subres.sessions.members import rendezvous
from subres.sessions.registry import SessionKey
from tests.bench.procs import ROOT, bench_header, bench_main, memory_kib, tree_cpu_seconds
from tests.e2e import aggregation, controlplane, subresserver
from tests.e2e.controlplane import ControlPlane
from tests.e2e.subresserver import SERVER_NAME, Profile, Subres
from tests.e2e.test_replicas import bind_users
from tests.e2e.test_subres import API, NS, USERS_GROUP
from tests.support import LOOPBACK_POLICY, Backend

__all__ = ["main"]

NAMES = ("replica-a", "replica-b", "replica-c")
OPEN_CONCURRENCY = 64
OPEN_TIMEOUT = 900.0
"""Seconds one level's sessions may take to open (the old design's Lease writes are slow)."""
WAIT = 60.0
WRITES = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


@dataclass(frozen=True)
class Settings:
    sessions: tuple[int, ...]
    kept: int
    window: float
    samples: int
    old: str


def parse(argv: Sequence[str]) -> Settings:
    doc = (__doc__ or "").split("\n\n")
    p = argparse.ArgumentParser(prog="python -m tests.bench.bench_replicas", description=doc[0])
    p.add_argument("--sessions", default="1000,5000,10000", help="live session levels")
    p.add_argument("--kept", type=int, default=1000, help="kept consoles")
    p.add_argument("--window", type=float, default=60.0, help="seconds each level is measured")
    p.add_argument("--samples", type=int, default=30, help="takeovers and round trips timed")
    p.add_argument("--old", default="efc49ce", help="commit of the old design ('' for none)")
    p.add_argument("--smoke", action="store_true", help="20 sessions, 5 kept, 5 s, no old")
    ns = p.parse_args(argv)
    if ns.smoke:
        return Settings((20,), 5, 5.0, 5, "")
    return Settings(
        tuple(int(n) for n in ns.sessions.split(",")), ns.kept, ns.window, ns.samples, ns.old
    )


@dataclass
class Level:
    sessions: int
    opened: int
    writes: dict[str, float]
    apiserver_cpu: float
    etcd_cpu: float
    kib_per_session: float


@dataclass
class Figures:
    design: str
    levels: list[Level] = field(default_factory=list)
    takeover: dict[str, float] = field(default_factory=dict)
    round_trip: dict[str, float | None] = field(default_factory=dict)
    """None: the writer's bytes never reached the observer (the session-Lease design's
    observer on another replica sees nothing, issue 18)."""
    attach: dict[str, float] = field(default_factory=dict)


# --- the cluster -------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def three_replicas(
    plane: ControlPlane, source: Path | None, kept: int
) -> AsyncIterator[list[Subres]]:
    """Replicas A, B and C of this checkout's subres (or of `source`), with their Pods."""
    with tempfile.TemporaryDirectory(prefix="subres-bench-replicas-") as tmp:
        # The older design has no per-namespace cap of kept consoles, nor knows its key.
        config = _kept_config(Path(tmp), kept) if source is None else None
        args = ("--replica-name=replica-a",)
        a = await subresserver.launch(plane, Profile(args=args, source=source, config=config))
        async with _replicas(plane, a, source) as servers:
            yield servers


@contextlib.asynccontextmanager
async def _replicas(
    plane: ControlPlane, a: Subres, source: Path | None
) -> AsyncIterator[list[Subres]]:
    """B and C beside A, and their Pods; all three stopped afterwards."""
    servers = [a]
    try:
        for name in NAMES[1:]:
            servers.append(await subresserver.replica(a, name))
        if source is None:
            for server, name in zip(servers, NAMES, strict=True):
                await subresserver.replica_pod(server, name)
            for server in servers:
                ready = functools.partial(_members, plane, server)
                assert await controlplane.poll(ready, timeout_s=WAIT), server.logs()
        yield servers
    finally:
        for server in servers[1:]:
            await server.stop()
        await plane.kubectl(
            "delete", "pod", "-n", subresserver.NAMESPACE, *NAMES,
            "--grace-period=0", "--force", "--wait=false", "--ignore-not-found",
        )  # fmt: skip
        await subresserver.shutdown(a)


def _kept_config(directory: Path, kept: int) -> Path:
    """A `--config` letting one namespace keep `kept` consoles (the default allows 100)."""
    path = directory / "config.yaml"
    consoles = {"maxKept": kept, "maxKeptPerNamespace": kept}
    path.write_text(yaml.safe_dump({"endpointPolicy": LOOPBACK_POLICY, "consoles": consoles}))
    return path


async def _members(plane: ControlPlane, server: Subres) -> bool:
    text = await _get_text(server.url + "/metrics", _admin(plane, server))
    return f"subres_replica_members {float(len(NAMES))}" in text


def _admin(plane: ControlPlane, server: Subres) -> dict[str, Any]:
    return {
        "ssl": server.ssl_context(plane.front_proxy_client),
        "server_hostname": SERVER_NAME,
        "headers": {"X-Remote-User": "admin", "X-Remote-Group": "system:masters"},
    }


async def _get_text(url: str, kwargs: dict[str, Any]) -> str:
    try:
        async with aiohttp.ClientSession() as http, http.get(url, **kwargs) as r:
            return await r.text()
    except aiohttp.ClientError:
        return ""


async def machines(plane: ControlPlane, names: Sequence[str], url: str, *, keep: bool) -> None:
    """Create Machines `names` (console on `url`), their status written as a controller would."""
    annotations = {"subres.dev/keep-console": "true"} if keep else {}
    gate = asyncio.Semaphore(16)

    async def one(name: str) -> None:
        body = {
            "apiVersion": "subres.dev/v1alpha1",
            "kind": "Machine",
            "metadata": {"name": name, "namespace": NS, "annotations": annotations},
            "spec": {},
        }
        status = {"status": {"phase": "Running", "console": {"endpoint": url}}}
        async with gate:
            await plane.api("POST", f"/apis/subres.dev/v1alpha1/namespaces/{NS}/machines", body)
            await plane.api(
                "PATCH",
                f"/apis/subres.dev/v1alpha1/namespaces/{NS}/machines/{name}/status",
                status,
                content_type="application/merge-patch+json",
            )

    await asyncio.gather(*(one(n) for n in names))


# --- sessions ----------------------------------------------------------------------------


@dataclass
class Clients:
    plane: ControlPlane
    http: aiohttp.ClientSession
    contexts: dict[int, ssl.SSLContext] = field(default_factory=dict)
    readers: set[asyncio.Task[None]] = field(default_factory=set)
    """Tasks reading the idle sessions (so that their pings are answered)."""

    def context(self, server: Subres) -> ssl.SSLContext:
        if server.port not in self.contexts:
            self.contexts[server.port] = server.ssl_context(self.plane.front_proxy_client)
        return self.contexts[server.port]

    async def open(
        self, server: Subres, name: str, sub: str = "console", user: str = "alice"
    ) -> aiohttp.ClientWebSocketResponse:
        where = f"wss://127.0.0.1:{server.port}{API}/namespaces/{NS}/machines/{name}/{sub}"
        return await self.http.ws_connect(
            where,
            ssl=self.context(server),
            server_hostname=SERVER_NAME,
            headers={"X-Remote-User": user, "X-Remote-Group": USERS_GROUP},
            heartbeat=None,
            autoping=True,
        )


async def open_many(
    clients: Clients, servers: list[Subres], names: Sequence[str]
) -> list[aiohttp.ClientWebSocketResponse]:
    gate = asyncio.Semaphore(OPEN_CONCURRENCY)
    opened: list[aiohttp.ClientWebSocketResponse] = []

    async def one(i: int, name: str) -> None:
        async with gate:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                ws = await clients.open(servers[i % len(servers)], name)
                opened.append(ws)
                # aiohttp answers the server's pings only while something reads: a session
                # nobody reads is dropped (no pong within 5 s) in the middle of the window.
                clients.readers.add(asyncio.create_task(_read_all(ws)))

    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(OPEN_TIMEOUT):
            await asyncio.gather(*(one(i, n) for i, n in enumerate(names)))
    return opened


async def _read_all(ws: aiohttp.ClientWebSocketResponse) -> None:
    async for _ in ws:
        pass


async def requests_by_verb(plane: ControlPlane) -> Counter[str]:
    """kube-apiserver's `apiserver_request_total`, summed by verb and resource."""
    text = await plane.api("GET", "/metrics")
    counts: Counter[str] = Counter()
    for line in str(text).splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(
            part.split("=", 1) for part in line[line.index("{") + 1 : line.index("}")].split(",")
        )
        verb, resource = (
            labels.get("verb", '""').strip('"'),
            labels.get("resource", '""').strip('"'),
        )
        counts[f"{verb} {resource}"] += int(float(line.rsplit(" ", 1)[1]))
    return counts


def _rss(servers: list[Subres]) -> int:
    total = 0
    for server in servers:
        assert server.process.popen is not None
        total += memory_kib(server.process.popen.pid)["Rss"]
    return total


async def measure_level(
    plane: ControlPlane,
    *,
    servers: list[Subres],
    clients: Clients,
    names: Sequence[str],
    window: float,
    baseline: int,
) -> tuple[Level, list[aiohttp.ClientWebSocketResponse]]:
    sessions = await open_many(clients, servers, names)
    before = await requests_by_verb(plane)
    cpu = (tree_cpu_seconds(plane.apiserver_pid), tree_cpu_seconds(plane.etcd_pid))
    started = time.monotonic()
    await asyncio.sleep(window)  # the measurement window itself
    seconds = time.monotonic() - started
    after = await requests_by_verb(plane)
    spent = (
        tree_cpu_seconds(plane.apiserver_pid) - cpu[0],
        tree_cpu_seconds(plane.etcd_pid) - cpu[1],
    )
    writes = {
        key: (after[key] - before[key]) / seconds
        for key in after
        if key.split(" ")[0].upper() in WRITES or key.split(" ")[0] in WRITES.values()
    }
    grown = _rss(servers) - baseline
    level = Level(
        sessions=len(names),
        opened=len(sessions),
        writes={k: v for k, v in writes.items() if v > 0},
        apiserver_cpu=100 * spent[0] / seconds,
        etcd_cpu=100 * spent[1] / seconds,
        kib_per_session=grown / max(len(sessions), 1),
    )
    return level, sessions


# --- latencies ---------------------------------------------------------------------------


def owner_of(name: str, servers: list[Subres], *, new: bool) -> tuple[Subres, Subres]:
    """The replica owning `name`'s console and another one (old design: A and B)."""
    if not new:
        return servers[0], servers[1]
    owner = rendezvous(SessionKey("machines", "console", NS, name), NAMES)
    index = NAMES.index(owner or NAMES[0])
    return servers[index], servers[(index + 1) % len(servers)]


async def takeover(clients: Clients, first: Subres, second: Subres, name: str) -> float:
    old = await clients.open(first, name)
    try:
        started = time.perf_counter()
        new = await clients.open(second, name, user="bob")
        async with asyncio.timeout(30):
            message = await old.receive()
        assert message.type == aiohttp.WSMsgType.CLOSE and message.data == 4001, message
        took = time.perf_counter() - started
        await new.close()
        return took
    finally:
        await old.close()


async def round_trip(
    clients: Clients, writer_at: Subres, observer_at: Subres, name: str, samples: int
) -> tuple[float, float | None]:
    """p50 seconds: observer attach (request to 101), and writer-send to observer-read
    (None when a byte did not reach the observer within 10 s)."""
    writer = await clients.open(writer_at, name)
    try:
        started = time.perf_counter()
        observer = await clients.open(observer_at, name, sub="console-observe", user="olive")
        attach = time.perf_counter() - started
        trips = []
        for _ in range(samples):
            sent = time.perf_counter()
            await writer.send_bytes(b"x")
            try:
                await observer.receive_bytes(timeout=10)
            except TimeoutError:
                await observer.close()
                return attach, None
            trips.append(time.perf_counter() - sent)
            await writer.receive_bytes(timeout=10)
        await observer.close()
        return attach, statistics.median(trips)
    finally:
        await writer.close()


async def latencies(
    clients: Clients, servers: list[Subres], figures: Figures, samples: int, *, new: bool
) -> None:
    name = "lat-0"
    owner, other = owner_of(name, servers, new=new)
    for label, pair in (("same replica", (owner, owner)), ("two replicas", (owner, other))):
        figures.takeover[label] = statistics.median(
            [await takeover(clients, *pair, name) for _ in range(samples)]
        )
        attaches, trips = zip(
            *[await round_trip(clients, *pair, name, samples) for _ in range(3)], strict=True
        )
        figures.attach[label] = statistics.median(attaches)
        arrived = [t for t in trips if t is not None]
        figures.round_trip[label] = statistics.median(arrived) if len(arrived) == 3 else None


# --- a run -------------------------------------------------------------------------------


async def design(
    plane: ControlPlane, settings: Settings, backend: Backend, source: Path | None
) -> Figures:
    figures = Figures(
        "session Leases (" + settings.old + ")" if source else "membership + peer relay"
    )
    async with (
        three_replicas(plane, source, settings.kept) as servers,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http,
    ):
        clients = Clients(plane, http)
        if source is None:  # the first design: the CRD is installed now
            names = [f"s-{i}" for i in range(max(settings.sessions))] + ["lat-0"]
            await machines(plane, names, backend.url, keep=False)
            await machines(plane, [f"k-{i}" for i in range(settings.kept)], backend.url, keep=True)
        async with asyncio.timeout(OPEN_TIMEOUT), backend.changed:
            await backend.changed.wait_for(lambda: backend.open >= settings.kept)
        await latencies(clients, servers, figures, settings.samples, new=source is None)
        baseline = _rss(servers)
        live: list[aiohttp.ClientWebSocketResponse] = []
        done = 0
        for level in settings.sessions:
            names = [f"s-{i}" for i in range(done, level)]
            measured, opened = await measure_level(
                plane,
                servers=servers,
                clients=clients,
                names=names,
                window=settings.window,
                baseline=baseline,
            )
            live += opened
            measured.sessions, measured.opened = level, len(live)
            figures.levels.append(measured)
            done = level
        await asyncio.gather(*(ws.close() for ws in live), return_exceptions=True)
        await asyncio.gather(*clients.readers, return_exceptions=True)
    return figures


@contextlib.contextmanager
def old_checkout(commit: str) -> Iterator[Path]:
    """A temporary `git worktree` of `commit`, removed afterwards."""
    where = Path(tempfile.mkdtemp(prefix="subres-bench-old-"))
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), commit],
        check=True,
        capture_output=True,
    )
    try:
        yield where
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(where)],
            check=False,
            capture_output=True,
        )
        shutil.rmtree(where, ignore_errors=True)


async def run(settings: Settings, argv: Sequence[str]) -> None:
    binaries = await asyncio.to_thread(controlplane.build_binaries)
    backend = await Backend().start_tcp()
    try:
        async with controlplane.start_control_plane(binaries) as plane:
            await aggregation.grant_delegated_auth(
                plane, namespace=subresserver.NAMESPACE, service_account="subres"
            )
            await bind_users(plane)
            results = [await design(plane, settings, backend, None)]
            if settings.old:
                with old_checkout(settings.old) as old:
                    results.append(await design(plane, settings, backend, old))
    finally:
        await backend.stop()
    print(report(settings, argv, results), flush=True)


def report(settings: Settings, argv: Sequence[str], results: list[Figures]) -> str:
    facts = (
        f"three replicas, {settings.kept} kept consoles, live writer sessions opened straight to "
        "the replicas (idle), all on one echo backend on 127.0.0.1",
        "writes/s: deltas of kube-apiserver's apiserver_request_total (create, update, patch, "
        "delete) "
        f"over {settings.window:g} s; CPU: utime+stime of kube-apiserver and etcd from /proc, "
        "as % of one core; memory: replicas' RSS growth over the sessions, per session",
        f"latencies: p50 of {settings.samples} takeovers / round trips (3 attaches)",
    )
    lines = [bench_header("Replicas at scale", "tests.bench.bench_replicas", argv, *facts), ""]
    lines += [
        "| design | live sessions (opened) | apiserver writes/s | writes by verb and resource "
        "| kube-apiserver CPU % | etcd CPU % | replica KiB/session |",
        "| --- | ---: | ---: | --- | ---: | ---: | ---: |",
    ]
    for figures in results:
        for level in figures.levels:
            detail = ", ".join(f"{k} {v:.2f}" for k, v in sorted(level.writes.items())) or "none"
            lines.append(
                f"| {figures.design} | {level.sessions} ({level.opened}) | "
                f"{sum(level.writes.values()):.2f} | {detail} | {level.apiserver_cpu:.1f} | "
                f"{level.etcd_cpu:.1f} | {level.kib_per_session:.1f} |"
            )
    lines += [
        "",
        "| design | where | takeover p50 ms | observer attach p50 ms "
        "| observer round trip p50 ms |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for figures in results:
        for where, took in figures.takeover.items():
            lines.append(
                f"| {figures.design} | {where} | {took * 1000:.1f} | "
                f"{figures.attach[where] * 1000:.1f} | {_ms(figures.round_trip[where])} |"
            )
    return "\n".join(lines)


def _ms(seconds: float | None) -> str:
    return "nothing arrived" if seconds is None else f"{seconds * 1000:.2f}"


def main(argv: Sequence[str] | None = None) -> None:
    bench_main(run, parse, argv)


if __name__ == "__main__":
    main()
