"""Thousands of live consoles through one real kube-apiserver with the shipped install.

Run from the checkout: `python -m tests.bench.bench_streams [--levels 1000,5000,10000]
[--without 600]`; `--smoke` is a short run for the test suite.

It starts a real etcd and kube-apiserver (`tests/e2e/controlplane.py`: default
--max-requests-inflight, API Priority and Fairness on), installs subres from
`deploy/` as the e2e suite does (the shipped FlowSchema `subres-streams` with
it) and runs two replicas: A behind the APIService, B beside it, each with
its Pod. kube-apiserver reaches only A (the APIService's ExternalName Service
is one address), so A fronts every session: those whose console A owns are
local, those B owns (about half, rendezvous hashing) are relayed A → B over
the peer port. Every Machine's console is one TCP echo backend on 127.0.0.1
(its own process).

alice, an ordinary user (group `subres:users`, bound as the e2e tests bind
it), opens raw WebSocket consoles through kube-apiserver (TLS, bearer token,
aiohttp), level by level, keeps them open and reads them (so that pings are
answered). For each level it prints the time to open it, p50/p99 per open,
the refusals (status and reason), kube-apiserver's RSS and CPU, etcd's RSS,
the replicas' RSS and KiB per session (A's for its local sessions and for the
front half of the relayed ones, B's for the owner half), and p50/p99 of 20
GETs of a namespaced list as alice through kube-apiserver (her requests stay
in `global-default`), before the sessions and while each level is open.
With `--without N`, after the levels are closed, the FlowSchema is deleted
and N sessions are opened again: the refusals it fixes.

Every process runs on 127.0.0.1, is started and stopped by PID, and every
wait is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import resource
import ssl
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import aiohttp
import yaml

from subres.sessions.members import rendezvous
from subres.sessions.registry import SessionKey
from tests.bench.bench_replicas import machines
from tests.bench.procs import (
    Child,
    bench_header,
    bench_main,
    memory_kib,
    spawn,
    tree_cpu_seconds,
)
from tests.e2e import aggregation, controlplane, subresserver
from tests.e2e.controlplane import ControlPlane
from tests.e2e.subresserver import Profile, Subres
from tests.e2e.test_replicas import bind_users, members
from tests.e2e.test_subres import API, NS, USERS_GROUP

__all__ = ["main"]

NAMES = ("replica-a", "replica-b")
FLOWCONTROL = subresserver.REPO / "deploy" / "base" / "flowcontrol.yaml"
SCHEMA = "subres-streams"
OPEN_CONCURRENCY = 64
OPEN_TIMEOUT = 20.0
"""Seconds one open may take (request to 101); past it the open counts as refused."""
LEVEL_TIMEOUT = 1800.0
"""Seconds one level may take to open."""
WAIT = 120.0
"""Bound on the replicas, the machines and the FlowSchema settling."""
GETS = 20
GET_TIMEOUT = 30.0
NOFILE = 65536
"""Descriptors each process may hold: kube-apiserver holds two per session (client and
subres), replica A two or three, the client and the echo backend one."""
USER = "alice"


@dataclass(frozen=True)
class Settings:
    levels: tuple[int, ...]
    without: int
    gets: int


def parse(argv: Sequence[str]) -> Settings:
    doc = (__doc__ or "").split("\n\n")
    p = argparse.ArgumentParser(prog="python -m tests.bench.bench_streams", description=doc[0])
    p.add_argument("--levels", default="1000,5000,10000", help="live console levels")
    p.add_argument(
        "--without", type=int, default=600, help="sessions opened without the FlowSchema (0: none)"
    )
    p.add_argument("--gets", type=int, default=GETS, help="list GETs timed per level")
    p.add_argument("--smoke", action="store_true", help="50 sessions, 20 without the FlowSchema")
    ns = p.parse_args(argv)
    if ns.smoke:
        return Settings((50,), 20, 5)
    return Settings(tuple(int(n) for n in ns.levels.split(",")), ns.without, ns.gets)


@dataclass
class Opened:
    """What opening a batch of sessions gave."""

    seconds: float = 0.0
    times: list[float] = field(default_factory=list)
    refused: Counter[str] = field(default_factory=Counter)


@dataclass
class Row:
    label: str
    sessions: int
    live: int
    local: int
    relayed: int
    opened: Opened
    apiserver_rss: int
    apiserver_cpu: float
    etcd_rss: int
    rss: tuple[int, int]
    fds: tuple[int, int, int]
    kib_local: float | None
    kib_front: float | None
    kib_owner: float | None
    gets: tuple[float, float, Counter[str]]
    emfile: tuple[int, int]
    probe: str = ""
    """When some were refused: what a plain GET of a refused console answered."""


def raise_descriptors() -> None:
    """As root, lift the hard limit too (children inherit it); else the soft one to hard."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(hard, NOFILE), max(hard, NOFILE)))
        return
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# --- the cluster -------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def echo_backend() -> AsyncIterator[tuple[Child, str]]:
    child = await spawn("echo", "tests.bench.echo_backend")
    try:
        async with asyncio.timeout(WAIT):
            port = int((await child.expect(r"^port (\d+)")).group(1))
        yield child, f"tcp://127.0.0.1:{port}"
    finally:
        await child.stop()


@contextlib.asynccontextmanager
async def two_replicas(plane: ControlPlane) -> AsyncIterator[tuple[Subres, Subres]]:
    """Replica A (behind the APIService) and B, with their Pods, both members."""
    a = await subresserver.launch(plane, Profile(args=("--replica-name=replica-a",)))
    b: Subres | None = None
    try:
        b = await subresserver.replica(a, "replica-b")
        await subresserver.replica_pod(a, "replica-a")
        await subresserver.replica_pod(b, "replica-b")
        for server in (a, b):
            ready = functools.partial(members, plane, server, len(NAMES))
            assert await controlplane.poll(ready, timeout_s=WAIT), server.logs()
        yield a, b
    finally:
        if b is not None:
            await b.stop()
        await plane.kubectl(
            "delete", "pod", "-n", subresserver.NAMESPACE, *NAMES,
            "--grace-period=0", "--force", "--wait=false", "--ignore-not-found",
        )  # fmt: skip
        await subresserver.shutdown(a)


async def bind_viewers(plane: ControlPlane) -> None:
    """alice's group may list Machines in NS (the ClusterRole `view` aggregates)."""
    await plane.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "streams-viewers", "namespace": NS},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "subres-machines-view",
            },
            "subjects": [
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": USERS_GROUP}
            ],
        }
    )


def owner(name: str) -> str:
    return rendezvous(SessionKey("machines", "console", NS, name), NAMES) or NAMES[0]


def pid_of(server: Subres) -> int:
    assert server.process.popen is not None, "subres is not running"
    return server.process.popen.pid


def rss(pid: int) -> int:
    return memory_kib(pid)["Rss"]


def descriptors(pid: int) -> int:
    """How many files `pid` holds open (what the open-files limit counts)."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


# --- the client --------------------------------------------------------------------------


@dataclass
class Client:
    plane: ControlPlane
    http: aiohttp.ClientSession
    context: ssl.SSLContext
    live: list[aiohttp.ClientWebSocketResponse] = field(default_factory=list)
    readers: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.plane.users[USER].token}"}

    def url(self, name: str, sub: str = "console") -> str:
        base = self.plane.url.replace("https://", "wss://")
        return f"{base}{API}/namespaces/{NS}/machines/{name}/{sub}"

    async def open(self, name: str) -> aiohttp.ClientWebSocketResponse:
        return await self.http.ws_connect(
            self.url(name),
            ssl=self.context,
            headers=self.headers,
            heartbeat=None,
            autoping=True,
        )

    async def open_many(self, names: Sequence[str]) -> Opened:
        gate = asyncio.Semaphore(OPEN_CONCURRENCY)
        result = Opened()

        async def one(name: str) -> None:
            async with gate:
                started = time.perf_counter()
                try:
                    async with asyncio.timeout(OPEN_TIMEOUT):
                        ws = await self.open(name)
                except aiohttp.WSServerHandshakeError as exc:
                    result.refused[f"{exc.status} {exc.message}"] += 1
                    return
                except (aiohttp.ClientError, OSError) as exc:
                    result.refused[f"{type(exc).__name__}: {exc}"[:120]] += 1
                    return
                except TimeoutError:
                    result.refused[f"no answer within {OPEN_TIMEOUT:g} s"] += 1
                    return
                result.times.append(time.perf_counter() - started)
                self.live.append(ws)
                # aiohttp answers the server's pings only while something reads.
                self.readers.add(asyncio.create_task(_read_all(ws)))

        started = time.perf_counter()
        async with asyncio.timeout(LEVEL_TIMEOUT):
            await asyncio.gather(*(one(n) for n in names))
        result.seconds = time.perf_counter() - started
        return result

    def still_open(self) -> int:
        return sum(1 for ws in self.live if not ws.closed)

    async def close_all(self) -> None:
        async with asyncio.timeout(WAIT * 5):
            gate = asyncio.Semaphore(OPEN_CONCURRENCY * 4)

            async def one(ws: aiohttp.ClientWebSocketResponse) -> None:
                async with gate:
                    with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                        await ws.close()

            await asyncio.gather(*(one(ws) for ws in self.live))
            await asyncio.gather(*self.readers, return_exceptions=True)
        self.live.clear()
        self.readers.clear()

    async def gets(self, count: int) -> tuple[float, float, Counter[str]]:
        """p50 and p99 seconds of `count` GETs of a namespaced list as alice; what failed."""
        url = f"{self.plane.url}/apis/subres.dev/v1alpha1/namespaces/{NS}/machines?limit=10"
        times: list[float] = []
        failed: Counter[str] = Counter()
        for _ in range(count):
            started = time.perf_counter()
            try:
                async with (
                    asyncio.timeout(GET_TIMEOUT),
                    self.http.get(url, ssl=self.context, headers=self.headers) as answer,
                ):
                    await answer.read()
                    if answer.status != 200:
                        failed[f"{answer.status} {answer.reason}"] += 1
                        continue
            except (aiohttp.ClientError, OSError) as exc:
                failed[type(exc).__name__] += 1
                continue
            except TimeoutError:
                failed[f"no answer within {GET_TIMEOUT:g} s"] += 1
                continue
            times.append(time.perf_counter() - started)
        return _quantile(times, 0.5), _quantile(times, 0.99), failed

    async def why(self, name: str) -> str:
        """A plain GET of `name`'s console: kube-apiserver's status and message, which a
        refused upgrade does not show."""
        url = self.url(name).replace("wss://", "https://")
        try:
            async with (
                asyncio.timeout(GET_TIMEOUT),
                self.http.get(url, ssl=self.context, headers=self.headers) as answer,
            ):
                text = await answer.text()
                status = answer.status
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            return f"{type(exc).__name__}: {exc}"[:200]
        with contextlib.suppress(ValueError, AttributeError):
            text = str(json.loads(text).get("message", text))
        return f"{status} {text.strip()}"[:200]

    async def level_of(self, name: str) -> str:
        """The uid of the priority level kube-apiserver puts alice's console request in."""
        url = self.url(name).replace("wss://", "https://")
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with (
                asyncio.timeout(GET_TIMEOUT),
                self.http.get(url, ssl=self.context, headers=self.headers) as answer,
            ):
                return answer.headers.get("X-Kubernetes-PF-PriorityLevel-UID", "")
        return ""


async def _read_all(ws: aiohttp.ClientWebSocketResponse) -> None:
    with contextlib.suppress(aiohttp.ClientError, OSError):
        async for _ in ws:
            pass


def _quantile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# --- a run -------------------------------------------------------------------------------


async def exempt_uid(plane: ControlPlane) -> str:
    got = await plane.kubectl("get", "prioritylevelconfiguration", "exempt", "-o", "yaml")
    return str(yaml.safe_load(got.check().stdout)["metadata"]["uid"])


async def settle_flowschema(client: Client, name: str, *, exempt: str, present: bool) -> None:
    """Wait until alice's console is classified into `exempt` (or out of it)."""

    async def classified() -> bool:
        level = await client.level_of(name)
        return level != "" and (level == exempt) == present

    assert await controlplane.poll(classified, timeout_s=WAIT), "FlowSchema never applied"


async def wait_served(client: Client, names: Sequence[str]) -> None:
    """Until each of `names` opens (both replicas' caches hold the Machines)."""

    async def opens(name: str) -> bool:
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
            async with asyncio.timeout(OPEN_TIMEOUT):
                ws = await client.open(name)
            await ws.close()
            return True
        return False

    for name in names:
        assert await controlplane.poll(functools.partial(opens, name), timeout_s=WAIT), name


async def run(settings: Settings, argv: Sequence[str]) -> None:
    raise_descriptors()
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    binaries = await asyncio.to_thread(controlplane.build_binaries)
    rows: list[Row] = []
    baseline_gets: tuple[float, float, Counter[str]] = (0.0, 0.0, Counter())
    async with (
        echo_backend() as (_, url),
        controlplane.start_control_plane(binaries) as plane,
    ):
        await aggregation.grant_delegated_auth(
            plane, namespace=subresserver.NAMESPACE, service_account="subres"
        )
        await bind_users(plane)
        await bind_viewers(plane)
        async with (
            two_replicas(plane) as (a, b),
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http,
        ):
            client = Client(plane, http, ssl.create_default_context(cafile=str(plane.server_ca)))
            names = [f"c-{i}" for i in range(max(*settings.levels, settings.without))]
            await machines(plane, names, url, keep=False)
            exempt = await exempt_uid(plane)
            await settle_flowschema(client, names[0], exempt=exempt, present=True)
            await wait_served(client, last_owned(names))
            baseline_gets = await client.gets(settings.gets)
            logs = (plane.workdir / "kube-apiserver.log", a.process.log)
            watch = Watch(plane, (pid_of(a), pid_of(b)), logs)
            rows += await with_flowschema(settings, client, watch, names)
            await client.close_all()
            if settings.without:
                rows.append(await without_flowschema(settings, client, watch, names, exempt))
    print(report(settings, argv, limit, baseline_gets, rows), flush=True)


def last_owned(names: Sequence[str]) -> list[str]:
    """The last Machine of `names` each replica owns."""
    return sorted({owner(n): n for n in names}.values())


async def with_flowschema(
    settings: Settings, client: Client, watch: Watch, names: Sequence[str]
) -> list[Row]:
    """Open every level, each one's local sessions (A owns them) first, then the relayed."""
    rows: list[Row] = []
    done = local = relayed = 0
    pids = watch.pids
    for level in settings.levels:
        batch = names[done:level]
        watch.start()
        start_rss = (rss(pids[0]), rss(pids[1]))
        opened = await client.open_many([n for n in batch if owner(n) == NAMES[0]])
        mid_rss = (rss(pids[0]), rss(pids[1]))
        more = await client.open_many([n for n in batch if owner(n) != NAMES[0]])
        end_rss = (rss(pids[0]), rss(pids[1]))
        local += len(opened.times)
        relayed += len(more.times)
        merged = Opened(
            opened.seconds + more.seconds,
            opened.times + more.times,
            opened.refused + more.refused,
        )
        kib = (
            _per(mid_rss[0] - start_rss[0], len(opened.times)),
            _per(end_rss[0] - mid_rss[0], len(more.times)),
            _per(end_rss[1] - mid_rss[1], len(more.times)),
        )
        row = watch.row(
            "with FlowSchema", level, live=client.still_open(), where=(local, relayed),
            opened=merged, kib=kib,
        )  # fmt: skip
        if merged.refused:
            row = replace(row, probe=await client.why(batch[-1]))
        rows.append(replace(row, gets=await client.gets(settings.gets)))
        print(_row(rows[-1]), file=sys.stderr, flush=True)
        done = level
    return rows


async def without_flowschema(
    settings: Settings, client: Client, watch: Watch, names: Sequence[str], exempt: str
) -> Row:
    """The FlowSchema deleted, `settings.without` sessions opened (then closed, and the
    FlowSchema applied again)."""
    plane = client.plane
    # The last level may have left the APIService unavailable for a while (the group
    # answers 503 then, whatever the FlowSchema).
    await aggregation.wait_apiservice_available(plane, subresserver.APISERVICE, timeout_s=WAIT)
    await wait_served(client, last_owned(names))
    (await plane.kubectl("delete", "flowschema", SCHEMA)).check()
    try:
        await settle_flowschema(client, names[0], exempt=exempt, present=False)
        watch.start()
        opened = await client.open_many(names[: settings.without])
        row = watch.row(
            "without FlowSchema", settings.without, live=client.still_open(), where=(0, 0),
            opened=opened, kib=(None, None, None),
        )  # fmt: skip
        row = replace(row, gets=await client.gets(settings.gets))
        print(_row(row), file=sys.stderr, flush=True)
        await client.close_all()
    finally:
        (await plane.kubectl("apply", "-f", str(FLOWCONTROL))).check()
    return row


@dataclass
class Watch:
    """What a level costs the processes: read before it opens and after."""

    plane: ControlPlane
    pids: tuple[int, int]
    logs: tuple[Path, Path]
    """kube-apiserver's log and replica A's: where running out of descriptors shows."""
    cpu: float = 0.0
    offsets: tuple[int, int] = (0, 0)

    def start(self) -> None:
        self.cpu = tree_cpu_seconds(self.plane.apiserver_pid)
        self.offsets = (_size(self.logs[0]), _size(self.logs[1]))

    def emfile(self) -> tuple[int, int]:
        """'too many open files' lines logged since `start`, kube-apiserver's and A's."""
        found = []
        for path, offset in zip(self.logs, self.offsets, strict=True):
            with path.open("rb") as log:
                log.seek(offset)
                found.append(log.read().lower().count(b"too many open files"))
        return found[0], found[1]

    def row(
        self,
        label: str,
        sessions: int,
        *,
        live: int,
        where: tuple[int, int],
        opened: Opened,
        kib: tuple[float | None, float | None, float | None],
    ) -> Row:
        plane, pids = self.plane, self.pids
        return Row(
            label=label,
            sessions=sessions,
            live=live,
            local=where[0],
            relayed=where[1],
            opened=opened,
            apiserver_rss=rss(plane.apiserver_pid),
            apiserver_cpu=tree_cpu_seconds(plane.apiserver_pid) - self.cpu,
            etcd_rss=rss(plane.etcd_pid),
            rss=(rss(pids[0]), rss(pids[1])),
            fds=(descriptors(plane.apiserver_pid), descriptors(pids[0]), descriptors(pids[1])),
            kib_local=kib[0],
            kib_front=kib[1],
            kib_owner=kib[2],
            gets=(0.0, 0.0, Counter()),
            emfile=self.emfile(),
        )


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _per(kib: int, sessions: int) -> float | None:
    return kib / sessions if sessions else None


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f}"


def _kib(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _row(row: Row) -> str:
    opened = row.opened
    refused = sum(opened.refused.values())
    why = "; ".join(f"{n} x {k}" for k, n in opened.refused.most_common(3))
    if row.probe:
        why += f"; a plain GET then: {row.probe}"
    if any(row.emfile):
        why += (
            f"; 'too many open files' logged {row.emfile[0]:,} times by kube-apiserver, "
            f"{row.emfile[1]:,} by A"
        )
    p50, p99, failed = row.gets
    get_failed = sum(failed.values())
    gets = f"{_ms(p50)} / {_ms(p99)}" + (
        f" ({get_failed} failed: {', '.join(failed)})" if get_failed else ""
    )
    return (
        f"| {row.label} | {row.sessions:,} | {row.live:,} ({row.local:,} / {row.relayed:,}) "
        f"| {opened.seconds:.1f} | {_ms(_quantile(opened.times, 0.5))} / "
        f"{_ms(_quantile(opened.times, 0.99))} | {refused}{f' ({why})' if refused else ''} "
        f"| {row.apiserver_rss / 1024:.0f} | {row.apiserver_cpu:.1f} | {row.etcd_rss / 1024:.0f} "
        f"| {row.rss[0] / 1024:.0f} / {row.rss[1] / 1024:.0f} "
        f"| {_kib(row.kib_local)} / {_kib(row.kib_front)} / {_kib(row.kib_owner)} "
        f"| {' / '.join(f'{n:,}' for n in row.fds)} | {gets} |"
    )


def report(
    settings: Settings,
    argv: Sequence[str],
    limit: int,
    baseline: tuple[float, float, Counter[str]],
    rows: list[Row],
) -> str:
    facts = (
        "real etcd + kube-apiserver (default --max-requests-inflight, APF on), subres installed "
        "from deploy/ with the FlowSchema `subres-streams` (streams → `exempt`); two replicas: "
        "A behind the APIService fronts every session, B owns about half (relayed A → B)",
        "alice (ordinary user) opens raw WebSocket consoles through kube-apiserver (TLS, bearer "
        f"token, aiohttp, {OPEN_CONCURRENCY} at a time), keeps them open and reads them; every "
        "console dials one TCP echo backend on 127.0.0.1 (its own process)",
        "open s: wall time to open the level's new sessions; per open: request to 101; "
        "RSS from /proc smaps_rollup; CPU: kube-apiserver's utime+stime while the level opened",
        "KiB/session: RSS growth while a level's new sessions opened, over their number: "
        "A for its local ones, A for the front half of relayed ones, B for the owner half",
        f"GET: p50/p99 of {settings.gets} GETs of "
        f"`/apis/subres.dev/v1alpha1/namespaces/{NS}/machines?limit=10` as alice "
        "(global-default), one at a time; before the sessions: "
        f"{_ms(baseline[0])} / {_ms(baseline[1])} ms",
        f"open files limit: {limit} per process (the hard limit here; kube-apiserver holds two "
        "per session, A two: the client's side and the backend's or B's)",
    )
    lines = [
        bench_header("Live consoles through kube-apiserver", "tests.bench.bench_streams", argv,
                     *facts),
        "",
        "| install | sessions | live (local / relayed) | open s | per open p50 / p99 ms "
        "| refused | kube-apiserver RSS MiB | kube-apiserver CPU s to open | etcd RSS MiB "
        "| A / B RSS MiB | KiB/session: A local / A front / B owner "
        "| open files: kube-apiserver / A / B | GET p50 / p99 ms |",
        "| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: |",
        *(_row(row) for row in rows),
    ]  # fmt: skip
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    bench_main(run, parse, argv)


if __name__ == "__main__":
    main()
