"""Throughput benchmark: bulk bytes each way through socat, websockify and subres.

Run from the checkout: `python -m tests.bench.bench_throughput [--quick]`.
It prints one markdown table: for each path, with and without TLS where the
path has it, MB/s upload (client → backend) and download (backend → client)
of `--mib` MiB in 64 KiB writes, and the CPU seconds per GB of the relay, of
the client side and of the backend, per direction.

Paths: a socat TCP relay (64 KiB buffers), websockify (WebSocket → TCP), and
subres's dialects: the console's raw WebSocket (`plain.kubevirt.io`), the
same console through a node agent (`subres agent`, mutual TLS, as deployed:
TLS only),
KubeVirt-style port-forward (`…/portforward/{port}`), Kubernetes-style
channel port-forward (`?ports=`, `v4.channel.k8s.io`), SPDY/3.1 port-forward
and SPDY tunnelled in a WebSocket; the last two are driven by client-go
(`tools/kubepeer`), whose CPU is counted on the client side, not the relay's.
The KubeVirt-style port-forward also runs through OpenSSH's sshd as a jump
host (`direct-tcpip`, the `ssh` backend); sshd's CPU counts as the backend's.

The data source, sink and WebSocket/TCP client are `loadgen` (Go, in
`tests/bench/loadgen`), so the ends of a path cost little CPU. Every process
runs on 127.0.0.1 on its own and is stopped by PID; every wait is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import re
import secrets
import shlex
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path

import yaml

from subres.serving import certs, loops
from tests import gotools
from tests.bench.agent import NODE, BenchAgent, start_agent
from tests.bench.client import GROUP_PATH, RAW
from tests.bench.procs import (
    ROOT,
    Child,
    build_loadgen,
    live_children,
    port_from_log,
    run_loadgen,
    spawn,
    spawn_program,
    tree_cpu_seconds,
    wait_listening,
)
from tests.ssh_support import OpenSsh, openssh

__all__ = ["PATHS", "main"]

MIB = 1024 * 1024
START_TIMEOUT = 60.0
"""Seconds a relay (or kubepeer) may take to start listening."""
CHILDREN_TIMEOUT = 3.0
"""Seconds a forking relay's per-connection child may take to exit after a transfer."""
CHANNEL = "v4.channel.k8s.io"


@dataclass(frozen=True)
class PathSpec:
    """One row kind of the table."""

    key: str
    label: str
    tls_modes: tuple[bool, ...] = (False, True)


PATHS = (
    PathSpec("socat", "socat TCP relay (`-b65536`, fork)"),
    PathSpec("websockify", "websockify (64 KiB messages)"),
    PathSpec("console", f"subres console, raw WebSocket (`{RAW}`)"),
    PathSpec(
        "agent-console",
        f"subres console through the node agent, raw WebSocket (`{RAW}`)",
        tls_modes=(True,),
    ),
    PathSpec("kubevirt-pf", "subres port-forward, KubeVirt raw WebSocket (`…/portforward/{port}`)"),
    PathSpec("channel-pf", f"subres port-forward, channel WebSocket (`?ports=`, `{CHANNEL}`)"),
    PathSpec("spdy-pf", "subres port-forward, SPDY/3.1 (client-go)"),
    PathSpec("tunnel-pf", "subres port-forward, SPDY in WebSocket (client-go)"),
    PathSpec("ssh-pf", "subres port-forward, KubeVirt raw WebSocket, through sshd (direct-tcpip)"),
)


@dataclass(frozen=True)
class Settings:
    """What one run measures."""

    mib: int
    paths: tuple[str, ...]
    tls: tuple[bool, ...]
    timeout: float
    """Seconds one transfer may take."""
    budget: float
    """Seconds the whole run may take; paths not reached are reported as skipped."""
    profile: Path | None = None
    """Directory for cProfile dumps of subres (served by the bench launcher), if any."""
    loops: tuple[str, ...] = (loops.DEFAULT,)
    """The event loops subres (server and agent) runs on: one table each."""

    @property
    def total(self) -> int:
        """Bytes per transfer."""
        return self.mib * MIB


def parse(argv: Sequence[str]) -> Settings:
    """Settings from the command line."""
    p = argparse.ArgumentParser(prog="python -m tests.bench.bench_throughput", description=__doc__)
    p.add_argument(
        "--quick", action="store_true", help="every path with 64 MiB per transfer, under 60 s"
    )
    p.add_argument("--mib", type=int, help="MiB each way per path (512; quick 64)")
    p.add_argument(
        "--loop",
        choices=(*loops.LOOPS, "both"),
        default=os.environ.get(loops.ENV) or loops.DEFAULT,
        help="event loop of subres's server and agent (default: $SUBRES_LOOP, else uvloop); "
        "both: one table per loop",
    )
    keys = [spec.key for spec in PATHS]
    p.add_argument("--paths", default=",".join(keys), help=f"which of {','.join(keys)}")
    p.add_argument("--tls", choices=("both", "on", "off"), default="both")
    p.add_argument(
        "--profile",
        type=Path,
        help="serve subres under cProfile (bench launcher), one dump per TLS mode in this dir",
    )
    ns = p.parse_args(argv)
    paths = tuple(k for k in ns.paths.split(",") if k)
    unknown = set(paths) - set(keys)
    if unknown:
        p.error(f"unknown paths: {', '.join(sorted(unknown))}")
    tls = {"both": (False, True), "on": (True,), "off": (False,)}[ns.tls]
    return Settings(
        mib=ns.mib or (64 if ns.quick else 512),
        paths=paths,
        tls=tls,
        timeout=15.0 if ns.quick else 60.0,
        budget=50.0 if ns.quick else 480.0,
        profile=ns.profile,
        loops=loops.LOOPS if ns.loop == "both" else (ns.loop,),
    )


# --- results -------------------------------------------------------------------------------


@dataclass
class Transfer:
    """One direction of one path."""

    seconds: float
    relay_cpu: float
    client_cpu: float
    backend_cpu: float
    agent_cpu: float = 0.0
    """The node agent's share of `relay_cpu` (agent paths only)."""


@dataclass
class Row:
    """Both directions of one path, or why they are missing."""

    spec: PathSpec
    tls: bool
    up: Transfer | None = None
    down: Transfer | None = None
    problem: str = ""


def _fmt_rate(total: int, transfer: Transfer | None) -> str:
    return f"{total / transfer.seconds / 1e6:.0f}" if transfer else "-"


def _fmt_cpu(total: int, transfer: Transfer | None, attr: str) -> str:
    return f"{getattr(transfer, attr) / (total / 1e9):.2f}" if transfer else "-"


def _fmt_busy(transfer: Transfer | None) -> str:
    return f"{100 * transfer.relay_cpu / transfer.seconds:.0f}" if transfer else "-"


def _fmt_ratio(row: Row, base: Row | None, direction: str) -> str:
    """Relay CPU per byte over socat's in the same TLS mode (the goal is at most 1.5)."""
    mine = getattr(row, direction)
    theirs = getattr(base, direction) if base is not None else None
    if mine is None or theirs is None or theirs.relay_cpu <= 0:
        return "-"
    return f"{mine.relay_cpu / theirs.relay_cpu:.2f}"


def table(rows: Sequence[Row], total: int, loop: str) -> str:
    """The markdown table."""
    socat = {row.tls: row for row in rows if row.spec.key == "socat" and not row.problem}
    lines = [
        f"### Throughput ({total // MIB} MiB each way in 64 KiB writes; MB = 10^6 bytes; "
        f"subres on {loop})",
        "",
        "| path | TLS | up MB/s | down MB/s | relay CPU s/GB up | relay CPU s/GB down "
        "| relay CPU ÷ socat up / down | relay busy % up / down | client CPU s/GB up / down "
        "| backend CPU s/GB up / down |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        base = socat.get(row.tls)
        cells = [
            row.spec.label,
            "yes" if row.tls else "no",
            _fmt_rate(total, row.up),
            _fmt_rate(total, row.down),
            _fmt_cpu(total, row.up, "relay_cpu"),
            _fmt_cpu(total, row.down, "relay_cpu"),
            f"{_fmt_ratio(row, base, 'up')} / {_fmt_ratio(row, base, 'down')}",
            f"{_fmt_busy(row.up)} / {_fmt_busy(row.down)}",
            f"{_fmt_cpu(total, row.up, 'client_cpu')} / {_fmt_cpu(total, row.down, 'client_cpu')}",
            f"{_fmt_cpu(total, row.up, 'backend_cpu')} / "
            f"{_fmt_cpu(total, row.down, 'backend_cpu')}",
        ]
        if row.spec.key == "agent-console" and row.up and row.down:
            agent = f"{_fmt_cpu(total, row.up, 'agent_cpu')} / "
            agent += _fmt_cpu(total, row.down, "agent_cpu")
            cells[0] += f" (the agent's part of the relay CPU s/GB up / down: {agent})"
        if row.problem:
            cells[0] += f" ({row.problem})"
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# --- setup -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Files:
    """Certificates, token and standalone objects, in a temp dir."""

    root: Path
    token: str
    serving: certs.ServingFiles

    def kubeconfig(self, port: int) -> Path:
        """A kubeconfig for kubepeer with our CA and token.

        clientcmd drops the credentials of an http server, so the kubeconfig
        always names https; the plain server is reached by an absolute http
        `--url`, to which client-go still sends the token.
        """
        cluster = {
            "server": f"https://127.0.0.1:{port}",
            "certificate-authority": str(self.serving.ca),
        }
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "bench", "cluster": cluster}],
            "users": [{"name": "bench", "user": {"token": self.token}}],
            "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": "bench"}}],
            "current-context": "bench",
        }
        path = self.root / f"kubeconfig-{port}"
        path.write_text(yaml.safe_dump(doc))
        return path


def write_files(root: Path, sink: int, source: int, sshd: OpenSsh | None) -> Files:
    """Machines `up` (console → sink), `down` (console → source), `pf` (both ports), and
    `sshpf` (both ports through `sshd` as a jump host, with the Secret it logs in with)."""
    serving = certs.ensure_self_signed(root / "certs", service="subres", namespace="subres-system")
    token = secrets.token_urlsafe(24)
    (root / "tokens.csv").write_text(f'{token},bench,bench-uid,"bench"\n')
    policy = {"schemes": ["tcp", "ssh"], "allowCIDRs": ["127.0.0.0/8"], "denyCIDRs": []}
    forward = {
        "address": ".status.portForward.address",
        "ports": ".status.portForward.ports",
        "ssh": {"credentials": ".status.portForward.secret", "via": ".status.portForward.jumpHost"},
    }
    parent = {
        "resource": "machines",
        "kind": "Machine",
        "source": {"group": "subres.dev", "version": "v1alpha1"},
        "subresources": {
            # Node-local: the consoles of machines on the agent's node go through it.
            "console": {"endpoint": ".status.console.endpoint", "nodeLocal": True},
            "portforward": forward,
        },
    }
    (root / "config.yaml").write_text(
        yaml.safe_dump({"endpointPolicy": policy, "parents": [parent]})
    )

    def machine(name: str, backends: dict[str, object], node: str = "") -> dict[str, object]:
        status = {"phase": "Running", **backends, **({"nodeName": node} if node else {})}
        return {
            "apiVersion": "subres.dev/v1alpha1",
            "kind": "Machine",
            "metadata": {"name": name, "namespace": "default"},
            "status": status,
        }

    ports = {"address": "127.0.0.1", "ports": [sink, source]}
    docs = [
        machine("up", {"console": {"endpoint": f"tcp://127.0.0.1:{sink}"}}),
        machine("down", {"console": {"endpoint": f"tcp://127.0.0.1:{source}"}}),
        machine("pf", {"portForward": ports}),
        # On the agent's node: the replica relays their consoles through it.
        machine("up-agent", {"console": {"endpoint": f"tcp://127.0.0.1:{sink}"}}, NODE),
        machine("down-agent", {"console": {"endpoint": f"tcp://127.0.0.1:{source}"}}, NODE),
    ]
    if sshd is not None:
        jump = {**ports, "jumpHost": sshd.url, "secret": "sshd-login"}
        docs.append(machine("sshpf", {"portForward": jump}))
        login = {
            "ssh-privatekey": sshd.keys.user_private().decode(),
            "known_hosts": sshd.known_hosts().decode(),
        }
        docs.append(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "sshd-login", "namespace": "default"},
                "stringData": login,
            }
        )
    (root / "machines.yaml").write_text(yaml.safe_dump_all(docs))
    return Files(root, token, serving)


def free_port() -> int:
    """A port nothing listens on right now (the relay binds it a moment later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# --- running a path --------------------------------------------------------------------------


@dataclass
class Endpoint:
    """How loadgen reaches one direction of a path."""

    args: list[str]
    """loadgen arguments after `tcp`/`ws` selection, without -dir and -bytes."""


@dataclass
class Setup:
    """A started relay: its processes, and the loadgen arguments per direction."""

    relay: list[Child]
    up: list[str]
    down: list[str]
    client_helpers: list[Child] = field(default_factory=list)
    """Client-side processes (kubepeer) whose CPU counts as the client's."""
    backend_helpers: list[int] = field(default_factory=list)
    """PIDs on the backend side (sshd as the jump host) whose CPU counts as the backend's."""
    forks: bool = False
    """The relay forks a child per connection: wait for it before reading CPU."""


class Bench:
    """The run: the loadgen binary, the backend, the files, and the rows measured."""

    def __init__(self, settings: Settings, loadgen: Path, files: Files, backend: Child) -> None:
        self.settings = settings
        self.loadgen = loadgen
        self.files = files
        self.backend = backend
        self.sink = 0
        self.source = 0
        self.kubepeer: Path | None = None
        self.sshd: OpenSsh | None = None

    @contextlib.asynccontextmanager
    async def started(self, spec: PathSpec, tls: bool, servers: Servers) -> AsyncIterator[Setup]:
        """Start what `spec` needs (or reuse the subres server) and stop it afterwards."""
        children: list[Child] = []
        try:
            yield await self._start(spec, tls, servers, children)
        finally:
            for child in reversed(children):
                with contextlib.suppress(ProcessLookupError):
                    await child.stop()

    async def _start(
        self, spec: PathSpec, tls: bool, servers: Servers, children: list[Child]
    ) -> Setup:
        ca = ["-ca", str(self.files.serving.ca)] if tls else []
        if spec.key == "socat":
            return await self._socat(tls, ca, children)
        if spec.key == "websockify":
            return await self._websockify(tls, ca, children)
        server = await servers.get(tls)
        scheme = "wss" if tls else "ws"
        base = f"{scheme}://127.0.0.1:{server.port}{GROUP_PATH}"
        ws = ["ws", *ca, "-token", self.files.token]
        if spec.key in ("console", "agent-console"):
            raw = [*ws, "-subprotocol", RAW]
            suffix = "-agent" if spec.key == "agent-console" else ""
            relay = [server.child] + ([servers.agent.child] if servers.agent and suffix else [])
            return Setup(
                relay,
                [*raw, "-url", f"{base}/up{suffix}/console"],
                [*raw, "-url", f"{base}/down{suffix}/console"],
            )
        if spec.key in ("kubevirt-pf", "ssh-pf"):
            raw = [*ws, "-subprotocol", RAW]
            name = "pf" if spec.key == "kubevirt-pf" else "sshpf"
            if name == "sshpf" and self.sshd is None:
                raise RuntimeError("sshd is not running")
            return Setup(
                [server.child],
                [*raw, "-url", f"{base}/{name}/portforward/{self.sink}"],
                [*raw, "-url", f"{base}/{name}/portforward/{self.source}"],
                backend_helpers=[self.sshd.process.pid] if name == "sshpf" and self.sshd else [],
            )
        if spec.key == "channel-pf":
            chan = [*ws, "-subprotocol", CHANNEL, "-channel"]
            return Setup(
                [server.child],
                [*chan, "-url", f"{base}/pf/portforward?ports={self.sink}"],
                [*chan, "-url", f"{base}/pf/portforward?ports={self.source}"],
            )
        transport = "spdy" if spec.key == "spdy-pf" else "websocket"
        peer, ports = await self._kubepeer(server.port, tls, transport, children)
        return Setup(
            [server.child],
            ["tcp", "-addr", f"127.0.0.1:{ports[self.sink]}"],
            ["tcp", "-addr", f"127.0.0.1:{ports[self.source]}"],
            client_helpers=[peer],
        )

    async def _socat(self, tls: bool, ca: list[str], children: list[Child]) -> Setup:
        ports = {}
        for backend in (self.sink, self.source):
            port = free_port()
            options = "reuseaddr,fork,bind=127.0.0.1"
            if tls:
                s = self.files.serving
                listen = f"OPENSSL-LISTEN:{port},{options},cert={s.cert},key={s.key},verify=0"
            else:
                listen = f"TCP-LISTEN:{port},{options}"
            argv = ["socat", "-b65536", listen, f"TCP:127.0.0.1:{backend}"]
            child = await spawn_program("socat", argv, log=self.log("socat"), stops_on_eof=False)
            children.append(child)
            await wait_listening(child, port)
            ports[backend] = port
        return Setup(
            list(children),
            ["tcp", *ca, "-addr", f"127.0.0.1:{ports[self.sink]}"],
            ["tcp", *ca, "-addr", f"127.0.0.1:{ports[self.source]}"],
            forks=True,
        )

    async def _websockify(self, tls: bool, ca: list[str], children: list[Child]) -> Setup:
        urls = {}
        for backend in (self.sink, self.source):
            port = free_port()
            s = self.files.serving
            extra = ["--cert", str(s.cert), "--key", str(s.key), "--ssl-only"] if tls else []
            args = [*extra, f"127.0.0.1:{port}", f"127.0.0.1:{backend}"]
            child = await spawn(
                "websockify", "websockify", *args, log=self.log("websockify"), stops_on_eof=False
            )
            children.append(child)
            await wait_listening(child, port)
            urls[backend] = f"{'wss' if tls else 'ws'}://127.0.0.1:{port}/"
        return Setup(
            list(children),
            ["ws", *ca, "-url", urls[self.sink]],
            ["ws", *ca, "-url", urls[self.source]],
            forks=True,
        )

    async def _kubepeer(
        self, port: int, tls: bool, transport: str, children: list[Child]
    ) -> tuple[Child, dict[int, int]]:
        if self.kubepeer is None:
            self.kubepeer = await asyncio.to_thread(gotools.kubepeer)
        argv = [
            str(self.kubepeer),
            "portforward",
            *("--kubeconfig", str(self.files.kubeconfig(port))),
            *(
                "--url",
                f"{'https' if tls else 'http'}://127.0.0.1:{port}{GROUP_PATH}/pf/portforward",
            ),
            *("--transport", transport),
            f"0:{self.sink}",
            f"0:{self.source}",
        ]
        child = await spawn_program("kubepeer", argv, log=self.log("kubepeer"))
        children.append(child)
        assert child.proc.stdout is not None
        async with asyncio.timeout(START_TIMEOUT):
            await child.expect(r"^ready$")
            listed = json.loads(await child.proc.stdout.readline())
        return child, {p["remote"]: p["local"] for p in listed}

    def log(self, name: str) -> Path:
        """Where a child's stderr goes."""
        return self.files.root / f"{name}.log"

    async def transfer(self, setup: Setup, direction: str) -> Transfer:
        """One loadgen run in `direction`, with every side's CPU around it."""
        args = setup.up if direction == "up" else setup.down
        relay = [c.pid for c in setup.relay]
        helpers = [c.pid for c in setup.client_helpers]
        backends = [self.backend.pid, *setup.backend_helpers]
        agents = [c.pid for c in setup.relay[1:] if c.name == "subres agent"]

        def sample() -> tuple[float, float, float, float]:
            return (
                sum(tree_cpu_seconds(p) for p in relay),
                sum(tree_cpu_seconds(p) for p in helpers),
                sum(tree_cpu_seconds(p) for p in backends),
                sum(tree_cpu_seconds(p) for p in agents),
            )

        before = sample()
        argv = [
            str(self.loadgen),
            *args[:1],
            *("-dir", direction, "-bytes", str(self.settings.total)),
            *("-timeout", f"{self.settings.timeout:.0f}s"),
            *args[1:],
        ]
        result = await run_loadgen(argv, limit=self.settings.timeout + 10)
        if setup.forks:
            await self._children_gone(relay)
        else:
            # Let the relay finish its side of the close before reading its CPU.
            await asyncio.sleep(0.2)
        after = sample()
        return Transfer(
            seconds=result["seconds"],
            relay_cpu=after[0] - before[0],
            client_cpu=after[1] - before[1] + result["cpu"],
            backend_cpu=after[2] - before[2],
            agent_cpu=after[3] - before[3],
        )

    async def _children_gone(self, pids: Sequence[int]) -> None:
        deadline = time.monotonic() + CHILDREN_TIMEOUT
        # Another process's state: nothing to await but a fresh look at /proc.
        while any(live_children(p) for p in pids) and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)


@dataclass
class Server:
    """A running subres and its port."""

    child: Child
    port: int


class Servers:
    """At most one subres per TLS mode, started on first use and stopped at the end."""

    def __init__(self, files: Files, profile: Path | None = None) -> None:
        self.files = files
        self.profile = profile
        self.running: dict[bool, Server] = {}
        self.agent: BenchAgent | None = None
        """The node agent every server may relay through (machines `*-agent`)."""

    async def get(self, tls: bool) -> Server:
        """The server for `tls`, started if needed."""
        if tls not in self.running:
            self.running[tls] = await self._start(tls)
        return self.running[tls]

    async def _start(self, tls: bool) -> Server:
        root = self.files.root
        if self.agent is None:
            self.agent = await start_agent(root, log=root / "agent.log")
        flags = [
            *self.agent.flags,
            *("--standalone", str(root / "machines.yaml")),
            *("--token-auth-file", str(root / "tokens.csv")),
            *("--config", str(root / "config.yaml")),
            *("--secure-port", "0", "--cert-dir", str(root / "certs")),
            *("--bind-address", "127.0.0.1"),
        ]
        mode = "tls" if tls else "plain"
        log = root / f"subres-{mode}.log"
        if self.profile is not None:
            self.profile.mkdir(parents=True, exist_ok=True)
            flags += ["--cprofile", str(self.profile.resolve() / f"subres-{mode}.prof")]
            if not tls:
                flags.append("--plain")
            child = await spawn(
                f"subres ({mode}, cProfile)",
                "tests.bench.serve_variant",
                *flags,
                log=log,
                stops_on_eof=False,
            )
        elif tls:
            child = await spawn("subres", "subres", "serve", *flags, log=log, stops_on_eof=False)
        else:
            child = await spawn(
                "subres (plain)",
                "tests.bench.serve_variant",
                *flags,
                "--plain",
                log=log,
                stops_on_eof=False,
            )
        try:
            return Server(child, await port_from_log(child, log))
        except BaseException:
            await child.stop()
            raise

    async def stop(self) -> None:
        """Stop every server by PID."""
        for server in self.running.values():
            await server.child.stop()
        self.running.clear()
        if self.agent is not None:
            await self.agent.child.stop()
            self.agent = None


# --- the run ---------------------------------------------------------------------------------


def _tool_version(argv: Sequence[str], pattern: str) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except OSError:
        return "missing"
    found = re.search(pattern, out.stdout + out.stderr)
    return found.group(1) if found else "?"


def header(argv: Sequence[str], settings: Settings) -> str:
    """What was run, where, with what."""
    command = " ".join(["python -m tests.bench.bench_throughput", *map(shlex.quote, argv)])
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    socat = _tool_version(["socat", "-V"], r"socat version (\S+)")
    go = _tool_version(["go", "version"], r"go version go(\S+)")
    return "\n".join(
        [
            "## subres throughput benchmark",
            "",
            f"- rerun: `cd {ROOT} && {command}`",
            f"- machine: nproc {os.cpu_count()}, load average {load} at start, "
            f"{platform.platform()}",
            f"- Python {platform.python_version()}, aiohttp {version('aiohttp')}, "
            f"websockify {version('websockify')}, socat {socat}, Go {go}, {ssl.OPENSSL_VERSION}",
            f"- {settings.mib} MiB each way per path; client, source and sink are `loadgen` (Go, "
            "gorilla/websocket, 64 KiB writes and messages, no compression); SPDY paths go "
            "through client-go's port-forwarder (`kubepeer`), counted as client CPU",
            "- relay CPU: the relay's processes (utime+stime from /proc, forked children "
            "included); busy % = relay CPU / wall time (100 = one core saturated)",
            "- all traffic on 127.0.0.1; the cores are shared with other work: numbers are "
            "noisy, run twice",
        ]
    )


async def measure(bench: Bench, servers: Servers, spec: PathSpec, tls: bool) -> Row:
    """Both directions of one path."""
    row = Row(spec, tls)
    try:
        async with bench.started(spec, tls, servers) as setup:
            row.up = await bench.transfer(setup, "up")
            row.down = await bench.transfer(setup, "down")
    except (RuntimeError, OSError, TimeoutError, subprocess.SubprocessError) as exc:
        row.problem = f"failed: {str(exc) or type(exc).__name__}"[:200].replace("|", "/")
        row.problem = row.problem.replace("\n", " ")
    return row


async def run(settings: Settings, argv: Sequence[str], emit: Callable[[str], None]) -> None:
    """Measure every path asked for within the run's budget and print the table."""
    emit(header(argv, settings))
    loadgen = await asyncio.to_thread(build_loadgen)
    for loop in settings.loops:
        # Every subres process (server, agent, bench launcher) reads it at start.
        os.environ[loops.ENV] = loop
        with tempfile.TemporaryDirectory(prefix="subres-throughput-") as tmp:
            async with contextlib.AsyncExitStack() as stack:
                sshd = None
                if "ssh-pf" in settings.paths:
                    sshd = await stack.enter_async_context(openssh(Path(tmp) / "sshd"))
                rows = await _paths(settings, loadgen, Path(tmp), sshd)
            emit(table(rows, settings.total, loop))
            emit(f"- load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


async def _paths(settings: Settings, loadgen: Path, root: Path, sshd: OpenSsh | None) -> list[Row]:
    deadline = time.monotonic() + settings.budget
    backend = await spawn_program(
        "backend", [str(loadgen), "backend", "-bytes", str(settings.total)]
    )
    servers: Servers | None = None
    rows: list[Row] = []
    try:
        async with asyncio.timeout(10):
            sink = int((await backend.expect(r"sink (\d+)")).group(1))
            source = int((await backend.expect(r"source (\d+)")).group(1))
        files = write_files(root, sink, source, sshd)
        bench = Bench(settings, loadgen, files, backend)
        bench.sink, bench.source, bench.sshd = sink, source, sshd
        servers = Servers(files, settings.profile)
        for spec in PATHS:
            for tls in settings.tls:
                if spec.key not in settings.paths or tls not in spec.tls_modes:
                    continue
                if time.monotonic() > deadline:
                    rows.append(Row(spec, tls, problem="skipped: time budget spent"))
                    continue
                rows.append(await measure(bench, servers, spec, tls))
    finally:
        if servers is not None:
            await servers.stop()
        await backend.stop()
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point."""
    args = list(sys.argv[1:] if argv is None else argv)
    settings = parse(args)

    def emit(text: str) -> None:
        print(text + "\n", flush=True)

    asyncio.run(run(settings, args, emit))


if __name__ == "__main__":
    main()
