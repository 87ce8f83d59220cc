"""Console benchmark: echo latency, session setup rate, idle-session memory.

Run from the checkout: `python -m tests.bench.bench_console [--quick]`.
It prints markdown tables:

1. Round-trip latency (p50/p99/mean, µs) of small messages through a TCP
   echo backend: directly over TCP, through subres with raw framing
   (`plain.kubevirt.io`), the same through a node agent (`subres agent`, its
   own process, mutual TLS), and through subres with `v5.channel.k8s.io`; then
   the same echo as an SSH console (`tests.bench.ssh_echo`, asyncssh): an SSH
   client straight to it, and subres with its `ssh://` backend.
2. Console sessions opened and closed per second (TLS handshake, upgrade,
   backend dial, close handshake), one at a time and with concurrency.
3. Server memory per idle console session (RSS, PSS and anonymous memory of
   the server process, after minus before, divided by the sessions), and the
   server CPU seconds spent opening them.
4. Server memory over repeated bursts of idle sessions: RSS open and shortly
   after they close, per cycle, against the baseline (`cycles.py`).
5. The writer's round trip with 0, 1 and 50 observers on its console, and
   100 kept consoles' memory and CPU (`sharing.py`).

Everything runs on 127.0.0.1 in separate processes: the echo backend, the
server (`python -m subres serve`, or the `serve_variant` harness), and, for
the memory phase, the client processes that hold the sessions. Every wait is
bounded; every process started is stopped by PID; the temp dir is removed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import re
import secrets
import ssl
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import aiohttp
import asyncssh
import yaml

from subres.serving import certs
from tests.bench import cycles, memory, sharing
from tests.bench.agent import NODE, start_agent
from tests.bench.client import RAW, V5, Target, raise_open_files_limit
from tests.bench.procs import (
    Child,
    bench_header,
    build_loadgen,
    cpu_seconds,
    port_from_log,
    run_loadgen,
    spawn,
)

__all__ = ["Settings", "main"]

WARMUP_FRACTION = 10
"""One warm-up round trip per this many measured ones (at least 20)."""
OPEN_TIMEOUT = 30.0
"""Seconds one session may take to open or close."""
RATE_TIMEOUT = 600.0
"""Seconds one session-rate row (all its sessions) may take."""


@dataclass(frozen=True)
class Settings:
    """What one run measures."""

    quick: bool
    roundtrips: int
    payload: int
    sessions: int
    concurrency: int
    idle: tuple[int, ...]
    phases: frozenset[str]
    variant: str
    ssl_buffer: int | None
    tracemalloc: bool
    shared_ssl_buffer: bool
    server_env: dict[str, str]
    """Extra environment for the memory phase's server, e.g. glibc malloc tunables."""
    budget: float
    """Seconds the whole run may take before it is cut short."""
    cycles: int
    cycle_sessions: int

    @property
    def machines(self) -> int:
        """Machines the standalone file defines: one per concurrent session."""
        return max((*self.idle, self.concurrency + 2, self.cycle_sessions))


def parse(argv: Sequence[str] | None) -> Settings:
    """Settings from the command line; --quick lowers the defaults."""
    p = argparse.ArgumentParser(prog="python -m tests.bench.bench_console", description=__doc__)
    p.add_argument("--quick", action="store_true", help="small counts, well under a minute")
    p.add_argument("--roundtrips", type=int, help="round trips per path (2000; quick 300)")
    p.add_argument("--payload", type=int, default=64, help="bytes per round trip")
    p.add_argument("--sessions", type=int, help="sessions per rate test (500; quick 100)")
    p.add_argument("--concurrency", type=int, default=16, help="concurrent opens in rate test")
    p.add_argument("--idle", help="idle session counts, comma-separated (1000,5000; quick 300)")
    p.add_argument(
        "--phases",
        default="latency,rate,memory,cycles,observers,kept",
        help="which of latency,rate,memory,cycles,observers,kept to run",
    )
    p.add_argument("--cycles", type=int, default=6, help="bursts in the cycles phase")
    p.add_argument("--cycle-sessions", type=int, help="idle sessions per burst (3000; quick 200)")
    p.add_argument(
        "--variant",
        choices=("serve", "tls", "plain"),
        default="serve",
        help="memory phase server: `subres serve`, or the bench harness with or without TLS",
    )
    p.add_argument("--ssl-buffer", type=int, help="harness only: asyncio TLS read buffer bytes")
    p.add_argument(
        "--shared-ssl-buffer", action="store_true", help="harness only: one TLS read buffer"
    )
    p.add_argument(
        "--tracemalloc", action="store_true", help="harness only: diff Python allocations"
    )
    p.add_argument(
        "--server-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="memory phase: set this in the server's environment (repeatable)",
    )
    ns = p.parse_args(argv)
    idle = ns.idle or ("300" if ns.quick else "1000,5000")
    variant = ns.variant
    if variant == "serve" and (ns.ssl_buffer is not None or ns.tracemalloc or ns.shared_ssl_buffer):
        variant = "tls"
    return Settings(
        quick=ns.quick,
        roundtrips=ns.roundtrips or (300 if ns.quick else 2000),
        payload=ns.payload,
        sessions=ns.sessions or (100 if ns.quick else 500),
        concurrency=ns.concurrency,
        idle=tuple(sorted(int(n) for n in idle.split(","))),
        phases=frozenset(ns.phases.split(",")),
        variant=variant,
        ssl_buffer=ns.ssl_buffer,
        tracemalloc=ns.tracemalloc,
        shared_ssl_buffer=ns.shared_ssl_buffer,
        server_env=dict(kv.split("=", 1) for kv in ns.server_env),
        budget=150.0 if ns.quick else 1200.0,
        cycles=ns.cycles,
        cycle_sessions=ns.cycle_sessions or (200 if ns.quick else 3000),
    )


# --- setup -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Files:
    """The server's inputs, written to a temp dir."""

    root: Path
    token: str
    agent_flags: tuple[str, ...] = ()
    """Flags that point the server at the running node agent (`m-agent` goes through it)."""

    @property
    def ca(self) -> Path:
        """The CA that signed the serving certificate."""
        return self.root / "certs" / "ca.crt"


@dataclass(frozen=True)
class SshEcho:
    """The SSH echo server: where it listens, its host key, the password it takes."""

    port: int
    host_key: str
    """Its public key, an OpenSSH line."""
    password: str


def write_files(root: Path, machines: int, backend_port: int, ssh: SshEcho) -> Files:
    """Certificates, token file, config, `machines` machines on one echo backend, and
    machine `ssh` whose console is the SSH echo server (with the Secret it logs in with)."""
    certs.ensure_self_signed(root / "certs", service="subres", namespace="subres-system")
    token = secrets.token_urlsafe(24)
    (root / "tokens.csv").write_text(f'{token},bench,bench-uid,"bench"\n')
    policy = {
        "schemes": ["tcp", "ssh"],
        "allowCIDRs": ["127.0.0.0/8"],
        "denyCIDRs": [],
        "socketDirs": [str(root)],
    }
    # Node-local: m-agent, the one machine on the agent's node, is dialed through the agent.
    console = {
        "endpoint": ".status.console.endpoint",
        "ssh": {"credentials": ".status.console.secret"},
        "nodeLocal": True,
    }
    parent = {
        "resource": "machines",
        "kind": "Machine",
        "source": {"group": "subres.dev", "version": "v1alpha1"},
        "subresources": {"console": console},
    }
    # The observers phase attaches 50 to one console: past the default caps, which it measures.
    caps = {"maxObserversPerConsole": 1000, "maxObservers": 1000}
    (root / "config.yaml").write_text(
        yaml.safe_dump({"endpointPolicy": policy, "parents": [parent], "session": caps})
    )

    def machine(name: str, console: dict[str, str]) -> dict[str, object]:
        node = {"nodeName": NODE} if name == "m-agent" else {}
        return {
            "apiVersion": "subres.dev/v1alpha1",
            "kind": "Machine",
            "metadata": {"name": name, "namespace": "default"},
            "status": {"phase": "Running", "console": console, **node},
        }

    endpoint = f"tcp://127.0.0.1:{backend_port}"
    names = ["m-agent", *(f"m{i}" for i in range(machines))]
    docs = [machine(name, {"endpoint": endpoint}) for name in names]
    docs.append(
        machine("ssh", {"endpoint": f"ssh://bench@127.0.0.1:{ssh.port}", "secret": "ssh-echo"})
    )
    docs.append(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "ssh-echo", "namespace": "default"},
            "stringData": {
                "password": ssh.password,
                "known_hosts": f"[127.0.0.1]:{ssh.port} {ssh.host_key}\n",
            },
        }
    )
    # CSafeDumper when available: 5,000 documents take seconds with the pure-Python one.
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    (root / "machines.yaml").write_text(yaml.dump_all(docs, Dumper=dumper))
    return Files(root, token)


@dataclass
class Server:
    """A running server process and how to reach it."""

    child: Child
    target: Target

    @property
    def pid(self) -> int:
        """The server's PID, for /proc."""
        return self.child.pid

    async def active_sessions(self, http: aiohttp.ClientSession) -> int:
        """The server's own count of live sessions (`subres_sessions_active`)."""
        return await self.sample(http, 'subres_sessions_active{subresource="console"}')

    async def sample(self, http: aiohttp.ClientSession, series: str) -> int:
        """One series of the server's `/metrics`, e.g. `subres_consoles_kept` (0 when absent)."""
        base = "https" if self.target.scheme == "wss" else "http"
        url = f"{base}://127.0.0.1:{self.target.port}/metrics"
        headers = {"Authorization": f"Bearer {self.target.token}"}
        async with http.get(url, headers=headers, ssl=self.target.ssl_context() or False) as r:
            text = await r.text()
        found = re.search(rf"^{re.escape(series)} (\S+)", text, re.M)
        return int(float(found.group(1))) if found else 0

    async def wait_sessions(self, http: aiohttp.ClientSession, count: int) -> None:
        """Wait until the server reports exactly `count` live sessions (callers bound it)."""
        # Another process's state: nothing to await but its next answer.
        while await self.active_sessions(http) != count:  # noqa: ASYNC110
            await asyncio.sleep(0.2)


def server_args(
    files: Files, variant: str, settings: Settings, *, machines: Path | None = None
) -> tuple[str, list[str]]:
    """The module to run and its flags (`machines`: another standalone file)."""
    flags = [
        *("--standalone", str(machines or files.root / "machines.yaml")),
        *("--token-auth-file", str(files.root / "tokens.csv")),
        *("--config", str(files.root / "config.yaml")),
        *("--secure-port", "0", "--cert-dir", str(files.root / "certs")),
        *("--bind-address", "127.0.0.1"),
        # Nobody reads the server's stdout: no audit lines there.
        "--session-audit-log=",
        *files.agent_flags,
    ]
    if variant == "serve":
        return "subres", ["serve", *flags]
    if variant == "plain":
        flags.append("--plain")
    if settings.ssl_buffer is not None:
        flags += ["--ssl-buffer", str(settings.ssl_buffer)]
    if settings.shared_ssl_buffer:
        flags.append("--shared-ssl-buffer")
    if settings.tracemalloc:
        flags += ["--tracemalloc", str(files.root / "trace")]
    return "tests.bench.serve_variant", flags


@contextlib.asynccontextmanager
async def running_server(
    files: Files,
    variant: str,
    settings: Settings,
    *,
    memory_phase: bool = False,
    machines: Path | None = None,
) -> AsyncIterator[Server]:
    """Start a server, learn its port from its log, stop it by PID afterwards."""
    module, args = server_args(files, variant, settings, machines=machines)
    log = files.root / f"server-{time.monotonic_ns()}.log"
    env = settings.server_env if memory_phase else {}
    child = await spawn(f"server ({variant})", module, *args, log=log, stops_on_eof=False, env=env)
    try:
        port = await port_from_log(child, log)
        scheme = "ws" if variant == "plain" else "wss"
        yield Server(child, Target(port=port, ca=files.ca, token=files.token, scheme=scheme))
    finally:
        await child.stop()


# --- round trips -------------------------------------------------------------------------


def summarize(samples_ns: Sequence[int]) -> tuple[float, float, float]:
    """p50, p99 and mean in microseconds."""
    ordered = sorted(samples_ns)
    p50 = ordered[len(ordered) // 2]
    p99 = ordered[min(len(ordered) - 1, len(ordered) * 99 // 100)]
    return p50 / 1e3, p99 / 1e3, statistics.fmean(ordered) / 1e3


async def timed(count: int, roundtrip: Callable[[], Awaitable[object]]) -> list[int]:
    """Times (ns) of `count` round trips, after a warm-up."""
    samples = []
    for i in range(count + warmup(count)):
        start = time.perf_counter_ns()
        await roundtrip()
        if i >= warmup(count):
            samples.append(time.perf_counter_ns() - start)
    return samples


async def tcp_roundtrips(port: int, count: int, payload: bytes) -> list[int]:
    """Round-trip times (ns) straight to the echo backend, after a warm-up."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    async def roundtrip() -> bytes:
        writer.write(payload)
        return await reader.readexactly(len(payload))

    try:
        return await timed(count, roundtrip)
    finally:
        writer.close()
        await writer.wait_closed()


def warmup(count: int) -> int:
    """Warm-up round trips before `count` measured ones."""
    return max(20, count // WARMUP_FRACTION)


async def ws_roundtrips(
    target: Target, machine: str, subprotocol: str, count: int, payload: bytes
) -> list[int]:
    """Round-trip times (ns) through subres; v5 frames carry a channel byte."""
    framed = payload if subprotocol == RAW else b"\x00" + payload
    header = 0 if subprotocol == RAW else 1
    async with target.connect(machine, subprotocol, target.ssl_context(), OPEN_TIMEOUT) as ws:
        if subprotocol != RAW:
            await ws.recv()  # the empty stdout message that says the stream is up

        async def roundtrip() -> None:
            await ws.send(framed)
            got = 0
            while got < len(payload):
                message = await ws.recv()
                got += len(message) - header

        return await timed(count, roundtrip)


async def ssh_roundtrips(ssh: SshEcho, count: int, payload: bytes) -> list[int]:
    """Round-trip times (ns) of an SSH console (asyncssh client, a PTY) to the echo server."""
    known = asyncssh.import_known_hosts(f"[127.0.0.1]:{ssh.port} {ssh.host_key}\n")
    async with asyncssh.connect(
        "127.0.0.1", ssh.port, username="bench", password=ssh.password, known_hosts=known,
        client_keys=None, agent_path=None, config=None,
    ) as conn:  # fmt: skip
        writer, reader, _ = await conn.open_session(term_type="xterm", encoding=None)

        async def roundtrip() -> None:
            writer.write(payload)
            await reader.readexactly(len(payload))

        samples = await timed(count, roundtrip)
        writer.write_eof()
        return samples


async def latency_table(server: Server, backend_port: int, ssh: SshEcho, settings: Settings) -> str:
    """Table 1: echo round trips by path."""
    payload = os.urandom(settings.payload)
    n = settings.roundtrips
    rows = [
        ("direct TCP to the echo backend", await tcp_roundtrips(backend_port, n, payload)),
        (
            f"subres, WebSocket+TLS, `{RAW}`",
            await ws_roundtrips(server.target, "m0", RAW, n, payload),
        ),
        (
            f"subres, WebSocket+TLS, `{RAW}`, through the node agent (mTLS)",
            await ws_roundtrips(server.target, "m-agent", RAW, n, payload),
        ),
        (
            f"subres, WebSocket+TLS, `{V5}`",
            await ws_roundtrips(server.target, "m1", V5, n, payload),
        ),
        ("SSH client straight to the SSH echo server", await ssh_roundtrips(ssh, n, payload)),
        (
            f"subres, WebSocket+TLS, `{RAW}`, console on the SSH echo server (`ssh://`)",
            await ws_roundtrips(server.target, "ssh", RAW, n, payload),
        ),
    ]
    lines = [
        f"### Console echo round trip ({settings.payload}-byte messages, {n} sequential, "
        f"after {warmup(n)} warm-up)",
        "",
        "| path | p50 µs | p99 µs | mean µs |",
        "| --- | ---: | ---: | ---: |",
    ]
    for label, samples in rows:
        p50, p99, mean = summarize(samples)
        lines.append(f"| {label} | {p50:.0f} | {p99:.0f} | {mean:.0f} |")
    return "\n".join(lines)


# --- session rate ------------------------------------------------------------------------


async def session_rate(server: Server, loadgen: Path, total: int, concurrency: int) -> str:
    """One table row: `total` sessions opened and closed, `concurrency` at a time.

    The Go loadgen opens them (TLS, upgrade, close handshake), so the client
    costs little next to the server and does not bound the rate.
    """
    target = server.target
    url = target.url("m{w}")
    args = ["sessions", "-url", url, "-n", str(total), "-c", str(concurrency)]
    args += ["-token", target.token, "-subprotocol", RAW]
    if target.scheme == "wss":
        args += ["-ca", str(target.ca)]
    cpu0 = cpu_seconds(server.pid)
    result = await run_loadgen([str(loadgen), *args], limit=RATE_TIMEOUT)
    server_cpu = cpu_seconds(server.pid) - cpu0
    ok = total - result["failed"]
    note = f" (first: {result['first_error'][:80]})" if result["failed"] else ""
    return (
        f"| {concurrency} | {total} | {result['failed']}{note} | {ok / result['seconds']:.0f} | "
        f"{1e3 * server_cpu / total:.2f} | {1e3 * result['cpu'] / total:.2f} |"
    )


async def rate_table(server: Server, settings: Settings) -> str:
    """Table 2: sessions per second, sequential and concurrent."""
    loadgen = await asyncio.to_thread(build_loadgen)
    await session_rate(server, loadgen, min(20, settings.sessions), 1)  # warm-up, not reported
    rows = [
        await session_rate(server, loadgen, settings.sessions, c) for c in (1, settings.concurrency)
    ]
    return "\n".join(
        [
            "### Console sessions opened and closed per second "
            "(TLS handshake + upgrade + backend dial + close; raw framing; Go client)",
            "",
            "| concurrency | sessions | failed | sessions/s | server CPU ms/session "
            "| client CPU ms/session |",
            "| ---: | ---: | ---: | ---: | ---: | ---: |",
            *rows,
        ]
    )


# --- the run -----------------------------------------------------------------------------


def header(argv: Sequence[str]) -> str:
    """What was run, where, with what."""
    return bench_header(
        "subres console benchmark",
        "tests.bench.bench_console",
        argv,
        f"aiohttp {version('aiohttp')}, websockets {version('websockets')}, {ssl.OPENSSL_VERSION}",
        "client: `websockets` asyncio client, compression off, TLS with an ECDSA "
        "certificate; all traffic on 127.0.0.1",
        "the cores are shared with other work: treat numbers as noisy",
    )


def emit(text: str) -> None:
    """Print a block as soon as it is measured, so partial runs still report."""
    print(text + "\n", flush=True)


async def run(settings: Settings, argv: Sequence[str]) -> None:
    """Every phase asked for, inside the run's time budget."""
    emit(header(argv))
    with tempfile.TemporaryDirectory(prefix="subres-bench-") as tmp:
        password = secrets.token_urlsafe(16)
        echo = await spawn("echo backend", "tests.bench.echo_backend")
        ssh_echo = await spawn("SSH echo server", "tests.bench.ssh_echo", password)
        try:
            async with asyncio.timeout(10):
                found = await echo.expect(r"port (\d+)")
                ssh_port = int((await ssh_echo.expect(r"port (\d+)")).group(1))
                host_key = (await ssh_echo.expect(r"hostkey (.+)")).group(1).strip()
            backend_port = int(found.group(1))
            ssh = SshEcho(ssh_port, host_key, password)
            files = write_files(Path(tmp), settings.machines, backend_port, ssh)
            agent = await start_agent(Path(tmp), log=Path(tmp) / "agent.log")
            try:
                files = dataclasses.replace(files, agent_flags=tuple(agent.flags))
                async with asyncio.timeout(settings.budget):
                    await run_phases(settings, files, backend_port, ssh)
            finally:
                await agent.child.stop()
        finally:
            await ssh_echo.stop()
            await echo.stop()


async def run_phases(settings: Settings, files: Files, backend_port: int, ssh: SshEcho) -> None:
    """Latency, rate and observers share one server; memory and kept get fresh ones."""
    if settings.phases & {"latency", "rate", "observers"}:
        async with running_server(files, "serve", settings) as server:
            if "latency" in settings.phases:
                emit(await latency_table(server, backend_port, ssh, settings))
            if "rate" in settings.phases:
                emit(await rate_table(server, settings))
            if "observers" in settings.phases:
                emit(await observers(server, settings))
    if "kept" in settings.phases:
        machines = files.root / "kept.yaml"
        sharing.kept_machines(machines, backend_port, kept=False)
        async with (
            running_server(files, "serve", settings, machines=machines) as server,
            aiohttp.ClientSession() as http,
        ):
            window = 2.0 if settings.quick else 10.0
            emit(await sharing.kept_table(server, http, machines, backend_port, window=window))
    if "memory" in settings.phases:
        async with (
            running_server(files, settings.variant, settings, memory_phase=True) as server,
            aiohttp.ClientSession() as http,
        ):
            emit(await memory.idle_table(server, http, files.root, settings))
    if "cycles" in settings.phases:
        async with (
            running_server(files, settings.variant, settings, memory_phase=True) as server,
            aiohttp.ClientSession() as http,
        ):
            emit(await cycles.cycles_table(server, http, settings))


async def observers(server: Server, settings: Settings) -> str:
    """Table 4: the writer's round trip as observers join its console."""

    def roundtrips(count: int, payload: bytes) -> Awaitable[list[int]]:
        return ws_roundtrips(server.target, sharing.MACHINE, V5, count, payload)

    async with aiohttp.ClientSession() as http:
        return await sharing.observers_table(server, http, settings, roundtrips)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point."""
    args = list(sys.argv[1:] if argv is None else argv)
    raise_open_files_limit()
    asyncio.run(run(parse(args), args))


if __name__ == "__main__":
    main()
