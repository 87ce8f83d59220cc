"""Test support: a standalone subres on loopback, and real backends to dial.

Everything here runs real code on 127.0.0.1: the server is the real aiohttp
application behind TLS, in this process (`start_standalone`) or as a real
`subres serve` child (`serve_process`); backends are real sockets that count
connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import re
import signal
import socket
import ssl
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import websockets
import yaml
from websockets.asyncio.client import connect

from subres.server.options import Options
from subres.server.run import Server, complete
from subres.serving import certs

__all__ = [
    "GROUP_VERSION",
    "LOOPBACK_POLICY",
    "OTHER_USERS",
    "Backend",
    "ServeProcess",
    "Standalone",
    "communicate",
    "end_process",
    "free_port",
    "machine",
    "node_local_config",
    "open_fds",
    "open_sockets",
    "relay_to_unix",
    "serve_process",
    "start_standalone",
    "wait_for",
]

GROUP_VERSION = "subresources.subres.dev/v1alpha1"
SERVE_START_TIMEOUT = 60.0
"""Seconds a `subres serve` child may take to listen on a busy machine."""
OTHER_USERS = ("bob", "carol")
"""Users besides alice that a standalone test server knows (group devs)."""

LOOPBACK_POLICY: dict[str, Any] = {"allowCIDRs": ["127.0.0.0/8"], "denyCIDRs": []}
"""An endpoint policy for backends on 127.0.0.0/8 (and nothing else)."""


def machine(
    name: str,
    *,
    console: str | None = None,
    phase: str = "Running",
    spec: dict[str, Any] | None = None,
    status: dict[str, Any] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A Machine object; its console is in `.status`, where subres reads backends by
    default; `spec` and `status` add to what the other arguments say."""
    body: dict[str, Any] = {}
    if console is not None:
        body["console"] = {"endpoint": console}
    meta: dict[str, Any] = {"name": name, "namespace": "default"}
    if annotations:
        meta["annotations"] = dict(annotations)
    return {
        "apiVersion": "subres.dev/v1alpha1",
        "kind": "Machine",
        "metadata": meta,
        "spec": spec or {},
        "status": {"phase": phase, **body, **(status or {})},
    }


def node_local_config(*node_local: str) -> dict[str, Any]:
    """A --config `parents` entry for Machines whose `node_local` subresources' tcp
    endpoints are on the machine's node (dialed by its agent)."""
    endpoints = {"endpoint": ".status.console.endpoint"}
    display = {"endpoint": ".status.vnc.endpoint"}
    subresources: dict[str, dict[str, Any]] = {
        "console": endpoints,
        "vnc": display,
        "screenshot": dict(display),
        "portforward": {
            "address": ".status.portForward.address",
            "ports": ".status.portForward.ports",
        },
    }
    for name in node_local:
        subresources[name] = {**subresources[name], "nodeLocal": True}
    machines = {
        "resource": "machines",
        "kind": "Machine",
        "source": {"group": "subres.dev", "version": "v1alpha1", "resource": "machines"},
        "subresources": subresources,
    }
    return {"parents": [machines]}


@dataclass
class Backend:
    """A TCP or unix echo server (or a custom handler) that counts connections."""

    handler: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Any] | None = None
    accepted: int = 0
    open: int = 0
    url: str = ""
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def start_tcp(self, host: str = "127.0.0.1") -> Backend:
        """Listen on `host` (127.0.0.1 by default), any port."""
        self._server = await asyncio.start_server(self._serve, host, 0)
        self.url = f"tcp://{host}:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def start_unix(self, path: Path) -> Backend:
        """Listen on a unix socket."""
        self._server = await asyncio.start_unix_server(self._serve, str(path))
        self.url = f"unix://{path}"
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        await self._count(+1, accepted=True)
        try:
            if self.handler is not None:
                await self.handler(reader, writer)
            else:
                await echo(reader, writer)
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            self._tasks.discard(task)
            await self._count(-1)

    async def _count(self, delta: int, *, accepted: bool = False) -> None:
        async with self.changed:
            self.open += delta
            self.accepted += accepted
            self.changed.notify_all()

    async def wait_open(self, count: int) -> None:
        """Wait (at most 5 s) until exactly `count` connections are open."""
        async with asyncio.timeout(5), self.changed:
            await self.changed.wait_for(lambda: self.open == count)

    async def stop(self) -> None:
        """Close the listener and every connection."""
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)
        if self._server is not None:
            await self._server.wait_closed()


async def relay_to_unix(
    path: Path, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """Join a connection to the unix socket at `path`, both ways, until both ends close."""
    up_reader, up_writer = await asyncio.open_unix_connection(str(path))

    async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        while data := await src.read(65536):
            dst.write(data)
            await dst.drain()
        dst.close()

    try:
        await asyncio.gather(copy(reader, up_writer), copy(up_reader, writer))
    finally:
        up_writer.close()


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Send back everything; half-close after the peer does."""
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    if writer.can_write_eof():
        writer.write_eof()


@dataclass
class Standalone:
    """A running standalone subres and what a client needs to reach it."""

    server: Server
    dir: Path
    token: str
    ca: Path
    client_ssl: ssl.SSLContext
    machines: Path
    client_ca: certs.KeyPair
    tokens: dict[str, str] = field(default_factory=dict)
    """Token of each further user (`OTHER_USERS`), by name."""

    @property
    def base(self) -> str:
        """`https://127.0.0.1:PORT`."""
        return f"https://127.0.0.1:{self.server.port}"

    def url(self, name: str, sub: str = "console", *, scheme: str = "wss") -> str:
        """A subresource URL of machine `default/name`."""
        return self.api_url(f"machines/{name}/{sub}", scheme=scheme)

    def api_url(self, path: str, *, scheme: str = "wss") -> str:
        """`…/namespaces/default/{path}` in the served group-version, or a full `/apis` path."""
        cfg = self.server.state.config
        if not path.startswith("/"):
            path = f"/apis/{cfg.group}/{cfg.version}/namespaces/default/{path}"
        return f"{scheme}://127.0.0.1:{self.server.port}{path}"

    def websocket(
        self, url: str, *protocols: str, close_timeout: float = 10, user: str = "alice"
    ) -> connect:
        """A `websockets` client of `url` as `user`, offering `protocols`, no compression."""
        return connect(
            url,
            ssl=self.client_ssl,
            additional_headers=self.auth_as(user),
            subprotocols=[websockets.Subprotocol(p) for p in protocols] or None,
            compression=None,
            max_size=None,
            open_timeout=5,
            close_timeout=close_timeout,
        )

    async def refused(self, url: str, *protocols: str) -> tuple[int, dict[str, Any]]:
        """A WebSocket upgrade of `url` that must be refused: its code and Status body."""
        with pytest.raises(websockets.InvalidStatus) as info:
            async with self.websocket(url, *protocols):
                pass
        response = info.value.response
        status: dict[str, Any] = json.loads(response.body or b"{}")
        assert status.get("kind") == "Status" and status.get("code") == response.status_code
        return response.status_code, status

    async def fetch(self, url: str, *, user: str = "alice") -> tuple[int, str, bytes]:
        """A plain GET of `url` as `user` (bounded): its status, Content-Type and body."""
        import aiohttp

        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http,
            http.get(url, ssl=self.client_ssl, headers=self.auth_as(user)) as response,
        ):
            kind = response.headers.get("Content-Type", "")
            return response.status, kind, await response.read()

    async def echoed(self, url: str, payload: bytes, *protocols: str) -> bytes:
        """Send `payload` on a new raw WebSocket to `url`; as many bytes as came back (bounded)."""
        async with self.websocket(url, *protocols) as ws, asyncio.timeout(30):
            await ws.send(payload)
            got = b""
            while len(got) < len(payload):
                message = await ws.recv()
                assert isinstance(message, bytes)
                got += message
            return got

    @property
    def auth(self) -> dict[str, str]:
        """The Authorization header of the test user."""
        return {"Authorization": f"Bearer {self.token}"}

    def audit_lines(self) -> list[dict[str, Any]]:
        """The session audit lines written so far, parsed."""
        path = self.dir / "audit.jsonl"
        text = path.read_text() if path.exists() else ""
        return [json.loads(line) for line in text.splitlines()]

    def auth_as(self, user: str) -> dict[str, str]:
        """The Authorization header of `user`: alice (the test user) or one of `OTHER_USERS`."""
        token = self.token if user == "alice" else self.tokens[user]
        return {"Authorization": f"Bearer {token}"}

    def write_machines(self, *objects: dict[str, Any]) -> None:
        """Replace the machines file and load it now."""
        tmp = self.machines.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump_all(list(objects)))
        tmp.replace(self.machines)
        self.server.source.reload_if_changed()

    def kubeconfig(self) -> Path:
        """A kubeconfig file for the test user, as kubectl and client libraries read it."""
        path = self.dir / "kubeconfig"
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "t",
                    "cluster": {"server": self.base, "certificate-authority": str(self.ca)},
                }
            ],
            "users": [{"name": "alice", "user": {"token": self.token}}],
            "contexts": [{"name": "t", "context": {"cluster": "t", "user": "alice"}}],
            "current-context": "t",
        }
        path.write_text(yaml.safe_dump(doc))
        return path

    def client_cert_ssl(self, user: str, groups: list[str]) -> ssl.SSLContext:
        """A client context presenting a certificate from the client CA."""
        pair = certs.issue_client(self.client_ca, user=user, groups=groups)
        cert, key = self.dir / f"{user}.crt", self.dir / f"{user}.key"
        pair.write(cert, key)
        ctx = ssl.create_default_context(cafile=str(self.ca))
        ctx.load_cert_chain(cert, key)
        return ctx


@contextlib.asynccontextmanager
async def start_standalone(
    tmp: Path,
    *objects: dict[str, Any],
    session: dict[str, Any] | None = None,
    policy: dict[str, Any] | None = None,
    config: dict[str, Any] | None = None,
    options: dict[str, Any] | None = None,
) -> AsyncIterator[Standalone]:
    """Start a standalone server with `objects`; stop it afterwards.

    Its endpoint policy (unless `policy` replaces it) allows loopback, which the
    default policy denies, because the tests' backends listen there, and `tmp`'s
    sockets. `config` replaces top-level keys of the test configuration (a 2 s
    connect timeout), e.g. `group`, `version` and `parents` of a profile;
    `options` replaces flags.
    """
    token = "test-token-" + os.urandom(8).hex()
    others = {user: f"{user}-token-" + os.urandom(8).hex() for user in OTHER_USERS}
    lines = [f'{token},alice,alice-uid,"devs,ops"']
    lines += [f"{t},{user},{user}-uid,devs" for user, t in others.items()]
    (tmp / "tokens.csv").write_text("\n".join(lines) + "\n")
    client_ca = certs.generate_ca("test-client-ca")
    client_ca.write(tmp / "client-ca.crt", tmp / "client-ca.key")
    settings = {
        "endpointPolicy": policy or LOOPBACK_POLICY | {"socketDirs": [str(tmp)]},
        "session": {"connectTimeout": 2, **(session or {})},
        **(config or {}),
    }
    (tmp / "config.yaml").write_text(yaml.safe_dump(settings))
    machines = tmp / "machines.yaml"
    machines.write_text(yaml.safe_dump_all(list(objects)))
    flags = Options(
        secure_port=0,
        bind_address="127.0.0.1",
        cert_dir=tmp / "certs",
        tls_cert_file=None,
        tls_private_key_file=None,
        client_ca_file=tmp / "client-ca.crt",
        config=tmp / "config.yaml",
        standalone=machines,
        token_auth_file=tmp / "tokens.csv",
        service_name="subres",
        service_namespace="subres-system",
        authorization_always_allow_paths=("/healthz", "/readyz", "/livez"),
        shutdown_grace=1.0,
        session_audit_log=str(tmp / "audit.jsonl"),
    )
    server = complete(dataclasses.replace(flags, **(options or {})))
    await server.start()
    ca = tmp / "certs" / "ca.crt"
    try:
        yield Standalone(
            server=server,
            dir=tmp,
            token=token,
            ca=ca,
            client_ssl=ssl.create_default_context(cafile=str(ca)),
            machines=machines,
            client_ca=client_ca,
            tokens=others,
        )
    finally:
        await server.stop()


@dataclass
class ServeProcess:
    """A `subres serve --standalone` child process and what a client needs to reach it."""

    proc: asyncio.subprocess.Process
    dir: Path
    token: str
    port: int = 0
    log: list[str] = field(default_factory=list)
    _reader: asyncio.Task[None] | None = None

    @property
    def base(self) -> str:
        """`https://127.0.0.1:PORT`."""
        return f"https://127.0.0.1:{self.port}"

    def ssl(self) -> ssl.SSLContext:
        """A client context that trusts the server's CA."""
        return ssl.create_default_context(cafile=str(self.dir / "certs" / "ca.crt"))

    def console(self, name: str) -> str:
        """The console URL of Machine default/`name`."""
        return f"{self.base}/apis/{GROUP_VERSION}/namespaces/default/machines/{name}/console"

    @property
    def auth(self) -> dict[str, str]:
        """The Authorization header of the test user."""
        return {"Authorization": f"Bearer {self.token}"}

    async def _read_log(self, ready: asyncio.Future[int]) -> None:
        """Keep the log (stderr) drained, and say which port the server bound."""
        assert self.proc.stderr is not None
        while line := (await self.proc.stderr.readline()).decode(errors="replace"):
            self.log.append(line)
            found = re.search(r"serving on https://127\.0\.0\.1:(\d+)", line)
            if found and not ready.done():
                ready.set_result(int(found.group(1)))


@contextlib.asynccontextmanager
async def serve_process(
    tmp: Path,
    *objects: dict[str, Any],
    delay: float,
    grace: float,
    port: int = 0,
    config: dict[str, Any] | None = None,
) -> AsyncIterator[ServeProcess]:
    """Run the real server in a child process on `port` (0: any), with `objects`; `config`
    adds top-level keys to its configuration.

    A second server started on the same `tmp` reuses its certificates and
    token, as a restarted or another replica would. A server still running
    at the end is killed by PID.
    """
    tokens = tmp / "tokens.csv"
    if not tokens.exists():
        tokens.write_text(f'{os.urandom(8).hex()},alice,alice-uid,"devs"\n')
    token = tokens.read_text().split(",", 1)[0]
    (tmp / "machines.yaml").write_text(yaml.safe_dump_all(list(objects)))
    settings = {"endpointPolicy": LOOPBACK_POLICY, **(config or {})}
    (tmp / "config.yaml").write_text(yaml.safe_dump(settings))
    certs.ensure_self_signed(tmp / "certs", service="subres", namespace="subres-system")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "subres", "serve", "--standalone", str(tmp / "machines.yaml"),
        "--token-auth-file", str(tokens), "--config", str(tmp / "config.yaml"),
        "--cert-dir", str(tmp / "certs"), "--bind-address", "127.0.0.1",
        f"--secure-port={port}", f"--shutdown-delay={delay}s", f"--shutdown-grace={grace}s",
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    server = ServeProcess(proc, tmp, token)
    ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    server._reader = asyncio.create_task(server._read_log(ready))
    try:
        async with asyncio.timeout(SERVE_START_TIMEOUT):
            server.port = await ready
        yield server
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await asyncio.wait([server._reader], timeout=5)


async def communicate(
    proc: asyncio.subprocess.Process, stdin: bytes, *, bound: float
) -> tuple[int, bytes, bytes]:
    """Feed `stdin` to a child started with its streams piped and read it to its end,
    killed past `bound` seconds: its exit code, stdout and stderr."""
    try:
        async with asyncio.timeout(bound):
            out, err = await proc.communicate(stdin)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out, err


async def end_process(
    proc: asyncio.subprocess.Process, sig: signal.Signals = signal.SIGTERM
) -> None:
    """Send `sig` to a child still running, wait a bounded time, then kill it.

    (tests/e2e/test_subres.py keeps its own: kubepeer ends on stdin EOF, not a signal.)
    """
    if proc.returncode is None:
        proc.send_signal(sig)
    try:
        async with asyncio.timeout(10):
            await proc.wait()
    except TimeoutError:
        proc.kill()
        await proc.wait()


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    """A loopback port nothing listens on now (for programs that must be told one)."""
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def open_fds() -> int:
    """How many file descriptors this process has open."""
    return len(os.listdir("/proc/self/fd"))


def open_sockets() -> int:
    """How many sockets this process has open.

    For leak checks around work that may make the event loop open a
    descriptor of its own once (uvloop's libuv reserves /dev/null for
    running out of descriptors): connections are sockets.
    """
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
    return count


async def wait_for(predicate: Callable[[], bool]) -> None:
    """Poll `predicate` until true, failing after 5 s.

    For states nothing signals, such as task and descriptor counts.
    """
    async with asyncio.timeout(5):
        while not predicate():  # noqa: ASYNC110 - no event exists for these counts
            await asyncio.sleep(0.01)
