"""A real etcd, kube-apiserver and kube-controller-manager on 127.0.0.1 for the e2e tests.

Owns the life of one throwaway control plane: its flags, the processes
(started by PID, stopped by PID with SIGTERM then SIGKILL), readiness,
restarts of kube-apiserver with the same flags and data, and the calls the
tests make against it: kubectl runs, admin API requests, server-side apply,
ServiceAccount tokens. Credentials are ``credentials.py``'s; delegated-auth
grants and APIService availability are ``aggregation.py``'s; deploying and
running the real subres is ``subresserver.py``'s. Binaries come from
``tests.gotools`` (built from the Go module proxy, cached). Nothing here
listens anywhere but 127.0.0.1.

Use the session fixture ``control_plane`` (``tests/e2e/conftest.py``) from any
test, sync or async on any event loop, or ``async with start_control_plane()``
for one of your own::

    token = await plane.service_account_token("subres-system", "subres")
    await aggregation.grant_delegated_auth(
        plane, namespace="subres-system", service_account="subres")
    server = await subresserver.launch(plane)  # deploy/ applied, subres Available
    (await plane.kubectl("get", "--raw", "/apis/...", user="alice")).check()
    await plane.restart_apiserver()
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

from subres.serving import certs
from tests import gotools
from tests.e2e import credentials
from tests.e2e.credentials import ADMIN_USER, StaticUser

__all__ = [
    "APIError",
    "Binaries",
    "ControlPlane",
    "ControlPlaneError",
    "KubectlResult",
    "Process",
    "Settings",
    "build_binaries",
    "free_ports",
    "launch",
    "output_of",
    "poll",
    "run_sync",
    "start_control_plane",
]

SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc"
"""``--service-account-issuer``; also the default audience of TokenRequests."""

START_TIMEOUT_S = 90.0
"""Bound on etcd plus kube-apiserver becoming ready on a busy 2-core machine."""

STOP_TIMEOUT_S = 20.0
"""How long a process gets after SIGTERM before SIGKILL."""

_POLL_INTERVAL_S = 0.2
_LOG_TAIL_CHARS = 6000
_FIELD_MANAGER = "subres-e2e"


class ControlPlaneError(RuntimeError):
    """The control plane could not be built, started or used; carries the logs."""


class APIError(ControlPlaneError):
    """kube-apiserver answered a request with an error status."""

    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        super().__init__(f"{method} {path} -> {status}: {body}")
        self.status = status
        self.body = body


@dataclass(frozen=True)
class Binaries:
    """The Go programs a control plane runs."""

    etcd: Path
    """etcd server."""
    kube_apiserver: Path
    """kube-apiserver."""
    kubectl: Path
    """kubectl, of the same release as kube-apiserver."""
    kube_controller_manager: Path
    """kube-controller-manager, of the same release; only its ClusterRole aggregation runs."""


def build_binaries() -> Binaries:
    """Build (or take from the cache) the control plane's programs; raise with go's output."""
    try:
        return Binaries(
            etcd=gotools.build("etcd"),
            kube_apiserver=gotools.build("kube-apiserver"),
            kubectl=gotools.kubectl(),
            kube_controller_manager=gotools.build("kube-controller-manager"),
        )
    except gotools.GoBuildError as exc:
        raise ControlPlaneError(f"cannot build the control plane:\n{exc}") from exc


@dataclass(frozen=True)
class Settings:
    """How a control plane runs; the defaults are the e2e suite's, on loopback only."""

    address: str = "127.0.0.1"
    """Where kube-apiserver listens and what it advertises (its certificate names it)."""
    apiserver_flags: tuple[str, ...] = ()
    """More kube-apiserver flags; one given twice takes the later value."""
    controllers: str = "clusterrole-aggregation"
    """kube-controller-manager's ``--controllers``."""
    controller_flags: tuple[str, ...] = ()
    """More kube-controller-manager flags."""


@dataclass(frozen=True)
class KubectlResult:
    """What a kubectl run printed and how it exited."""

    args: tuple[str, ...]
    """The arguments after ``kubectl``."""
    returncode: int
    """Exit code."""
    stdout: str
    """Standard output."""
    stderr: str
    """Standard error."""

    def check(self) -> KubectlResult:
        """Self when kubectl succeeded, else a ControlPlaneError with its output."""
        if self.returncode != 0:
            raise ControlPlaneError(
                f"kubectl {' '.join(self.args)} exited {self.returncode}:\n"
                f"{self.stdout}\n{self.stderr}"
            )
        return self

    def json(self) -> Any:
        """Standard output parsed as JSON (for ``-o json`` and ``get --raw``)."""
        return json.loads(self.stdout)


@dataclass
class Process:
    """One child process we started, with its command line and log file."""

    name: str
    args: list[str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None
    cwd: Path | None = None
    """Where it runs (and so, for ``python -m``, whose code it imports); ours by default."""

    def start(self) -> None:
        with self.log.open("ab") as log:
            # A session of its own: a terminal's Ctrl-C goes to pytest, which
            # then stops the process by PID in its teardown.
            self.popen = subprocess.Popen(
                self.args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=self.cwd,
            )

    def exited(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    async def stop(self) -> None:
        """SIGTERM, wait a bounded time, then SIGKILL; always reaps the child."""
        popen, self.popen = self.popen, None
        if popen is None or popen.poll() is not None:
            return
        popen.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(popen.wait, STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            _kill(popen)
        except BaseException:
            _kill(popen)  # cancelled: leave nothing running behind us
            raise

    def tail(self) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except FileNotFoundError:
            return f"({self.log} missing)"
        return (
            f"--- {self.name} log ({self.log}), last {_LOG_TAIL_CHARS} chars ---\n"
            + (text[-_LOG_TAIL_CHARS:])
        )


def _kill(popen: subprocess.Popen[bytes]) -> None:
    popen.kill()
    # SIGKILL cannot be ignored; the bounded wait is only for the kernel to reap it.
    popen.wait(10)


@dataclass
class ControlPlane:
    """A running etcd + kube-apiserver and what it takes to talk to them."""

    binaries: Binaries
    """The programs in use."""
    workdir: Path
    """Temporary directory with certificates, kubeconfigs, data and logs."""
    url: str
    """kube-apiserver's base URL, ``https://127.0.0.1:<port>``."""
    admin_kubeconfig: Path
    """Kubeconfig of the admin (client certificate, ``system:masters``)."""
    server_ca: Path
    """CA that signed kube-apiserver's serving certificate."""
    client_ca: certs.KeyPair
    """``--client-ca-file``: certificates it signs authenticate as CN / O."""
    front_proxy_ca: certs.KeyPair
    """``--requestheader-client-ca-file``: aggregated servers trust X-Remote-* from it."""
    front_proxy_client: certs.KeyPair
    """``--proxy-client-cert-file``: what kube-apiserver presents to aggregated servers."""
    users: Mapping[str, StaticUser]
    """Static token users by name."""
    _etcd: Process
    _apiserver: Process
    _controllers: Process
    _admin_cert: Path
    _admin_key: Path

    def pids(self) -> list[int]:
        """Process ids of the running etcd, kube-apiserver and kube-controller-manager."""
        processes = (self._etcd, self._apiserver, self._controllers)
        return [p.popen.pid for p in processes if p.popen is not None]

    @property
    def etcd_pid(self) -> int:
        """etcd's process id (a benchmark reads its CPU from /proc)."""
        popen = self._etcd.popen
        if popen is None:
            raise self.failure("etcd is not running")
        return popen.pid

    @property
    def apiserver_pid(self) -> int:
        """kube-apiserver's process id (a benchmark reads its CPU from /proc)."""
        popen = self._apiserver.popen
        if popen is None:
            raise self.failure("kube-apiserver is not running")
        return popen.pid

    # -- kubectl -----------------------------------------------------------

    def kubeconfig_for(self, user: str) -> Path:
        """Kubeconfig for a static token user (``alice``, ``bob``), or ``admin``."""
        if user == ADMIN_USER:
            return self.admin_kubeconfig
        return self.token_kubeconfig(user, self.users[user].token)

    def token_kubeconfig(self, name: str, token: str) -> Path:
        """Kubeconfig that authenticates with a bearer token (e.g. a ServiceAccount's)."""
        path = self.workdir / "kubeconfigs" / f"{name}.kubeconfig"
        credentials.write_kubeconfig(
            path, server=self.url, ca=self.server_ca.read_bytes(), user={"token": token}
        )
        return path

    async def kubectl(
        self,
        *args: str,
        user: str = ADMIN_USER,
        kubeconfig: Path | None = None,
        stdin: str | None = None,
        timeout_s: float = 60.0,
    ) -> KubectlResult:
        """Run our kubectl as `user` (or with `kubeconfig`); never raises on its exit code."""
        env = dict(os.environ)
        env["KUBECONFIG"] = str(kubeconfig or self.kubeconfig_for(user))
        # Discovery caches per server address; keep them out of $HOME.
        env["KUBECACHEDIR"] = str(self.workdir / "kubecache")
        proc = await asyncio.create_subprocess_exec(
            str(self.binaries.kubectl),
            *args,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        try:
            out, err = await asyncio.wait_for(
                proc.communicate(stdin.encode() if stdin is not None else None), timeout_s
            )
        except TimeoutError:
            raise ControlPlaneError(f"kubectl {' '.join(args)} ran over {timeout_s}s") from None
        finally:
            if proc.returncode is None:  # timed out or cancelled
                proc.kill()
                await proc.wait()
        assert proc.returncode is not None
        return KubectlResult(
            args=args, returncode=proc.returncode, stdout=out.decode(), stderr=err.decode()
        )

    # -- the API as admin --------------------------------------------------

    def admin_ssl_context(self) -> ssl.SSLContext:
        """TLS context that trusts kube-apiserver and presents the admin certificate."""
        context = ssl.create_default_context(cafile=str(self.server_ca))
        context.load_cert_chain(self._admin_cert, self._admin_key)
        return context

    async def api(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        *,
        content_type: str = "application/json",
        params: Mapping[str, str] | None = None,
        token: str | None = None,
        timeout_s: float = 30.0,
    ) -> Any:
        """One request as admin (or with a bearer `token`); the decoded JSON answer (or text).

        Raises APIError for any status outside 2xx.
        """
        headers = {"Accept": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        data = None if body is None else json.dumps(body).encode()
        if data is not None:
            headers["Content-Type"] = content_type
        context = self.admin_ssl_context() if token is None else self._ca_only_context()
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session,
            session.request(
                method, self.url + path, data=data, headers=headers, params=params, ssl=context
            ) as response,
        ):
            text = await response.text()
            if response.status >= 300:
                raise APIError(method, path, response.status, text)
            if response.content_type != "application/json":
                return text  # /readyz and friends answer plain text
            return json.loads(text)

    async def apply(self, obj: Mapping[str, Any]) -> Any:
        """Server-side apply of one object as admin: create it or bring it to `obj`."""
        return await self.api(
            "PATCH",
            _object_path(obj),
            obj,
            content_type="application/apply-patch+yaml",
            params={"fieldManager": _FIELD_MANAGER, "force": "true"},
        )

    async def ensure_namespace(self, name: str) -> None:
        """Create the namespace unless it exists (no controller manager deletes them)."""
        await self.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    async def service_account_token(
        self,
        namespace: str,
        name: str,
        *,
        audiences: Sequence[str] = (),
        expiration_seconds: int = 3600,
    ) -> str:
        """A TokenRequest token for the ServiceAccount, created (with its namespace) if missing."""
        await self.ensure_namespace(namespace)
        await self.apply(
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": name, "namespace": namespace},
            }
        )
        spec: dict[str, Any] = {"expirationSeconds": expiration_seconds}
        if audiences:
            spec["audiences"] = list(audiences)
        answer = await self.api(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
        )
        return str(answer["status"]["token"])

    # -- lifecycle ---------------------------------------------------------

    async def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Poll ``/readyz`` until 200, either process exits, or `timeout_s` passes."""

        async def ready() -> bool:
            for process in (self._etcd, self._apiserver):
                if process.exited() is not None:
                    raise self.failure(f"{process.name} exited with {process.exited()}")
            try:
                await self.api("GET", "/readyz", timeout_s=5.0)
            except (aiohttp.ClientError, TimeoutError, APIError):
                return False
            return True

        if not await poll(ready, timeout_s=timeout_s):
            raise self.failure(f"kube-apiserver not ready within {timeout_s:.0f}s")

    async def stop_apiserver(self) -> None:
        """Stop kube-apiserver only (SIGTERM, then SIGKILL); etcd and the data stay."""
        await self._apiserver.stop()

    async def start_apiserver(self) -> None:
        """Start kube-apiserver again with the same flags, port and data; wait until ready."""
        self._apiserver.start()
        await self.wait_ready()

    async def restart_apiserver(self) -> None:
        """Stop kube-apiserver and start it again with the same flags and data; wait ready."""
        await self.stop_apiserver()
        await self.start_apiserver()

    async def stop_controllers(self) -> None:
        """Stop kube-controller-manager only: nothing recreates what is deleted after this."""
        await self._controllers.stop()

    async def stop(self) -> None:
        """Stop the processes by PID (etcd last) and remove the work directory."""
        try:
            await self._controllers.stop()
            await self._apiserver.stop()
            await self._etcd.stop()
        finally:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def failure(self, reason: str) -> ControlPlaneError:
        """An error naming `reason` with the tail of both logs."""
        return ControlPlaneError(f"{reason}\n{self.logs()}")

    def apiserver_log(self) -> str:
        """kube-apiserver's whole log so far (every run of it)."""
        return self._apiserver.log.read_text(errors="replace")

    def logs(self) -> str:
        """The tails of the logs, for a failing test's message."""
        return f"{self._apiserver.tail()}\n{self._etcd.tail()}\n{self._controllers.tail()}"

    def _ca_only_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.server_ca))


@contextlib.asynccontextmanager
async def start_control_plane(binaries: Binaries | None = None) -> AsyncIterator[ControlPlane]:
    """Start etcd and kube-apiserver in a fresh temporary directory; stop both on exit."""
    plane = await launch(binaries or build_binaries())
    try:
        yield plane
    finally:
        await plane.stop()


async def launch(binaries: Binaries, settings: Settings | None = None) -> ControlPlane:
    """Start a control plane and wait until it is ready; the caller must ``stop()`` it."""
    workdir = Path(tempfile.mkdtemp(prefix="subres-e2e-"))
    try:
        plane = _prepare(binaries, workdir, settings or Settings())
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    try:
        plane._etcd.start()
        plane._apiserver.start()
        await plane.wait_ready()
        plane._controllers.start()
    except BaseException:
        await plane.stop()
        raise
    return plane


T = TypeVar("T")


def run_sync(coro: Awaitable[T]) -> T:
    """Run a coroutine to completion on a loop of its own in another thread.

    Lets a synchronous session fixture start and stop the control plane whatever
    event loop the tests use: nothing in ControlPlane is tied to a loop.
    """

    async def wrapper() -> T:
        return await coro

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, wrapper()).result()


async def output_of(
    *args: str, timeout_s: float, cwd: Path | None = None, env: Mapping[str, str] | None = None
) -> tuple[int, str]:
    """Run a program to its end (killed past `timeout_s`): its exit code and its output
    (standard output and error together)."""
    proc = await asyncio.create_subprocess_exec(
        *args, cwd=cwd, env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        async with asyncio.timeout(timeout_s):
            output, _ = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, output.decode(errors="replace")


async def poll(condition: Callable[[], Awaitable[bool]], *, timeout_s: float) -> bool:
    """Call `condition` until it is true (True) or `timeout_s` seconds pass (False)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if await condition():
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(_POLL_INTERVAL_S)


# -- setting up a work directory ------------------------------------------


def _prepare(binaries: Binaries, workdir: Path, settings: Settings) -> ControlPlane:
    pki = credentials.write_pki(workdir / "pki", addresses=sorted({"127.0.0.1", settings.address}))
    etcd_port, peer_port = free_ports(2)
    (apiserver_port,) = free_ports(1, address=settings.address)
    url = f"https://{settings.address}:{apiserver_port}"
    admin_kubeconfig = workdir / "kubeconfigs" / "admin.kubeconfig"
    credentials.write_kubeconfig(
        admin_kubeconfig,
        server=url,
        ca=pki.server_ca.cert_pem(),
        user=credentials.admin_user_entry(pki),
    )
    etcd = Process(
        name="etcd",
        args=_etcd_args(binaries.etcd, workdir / "etcd", etcd_port, peer_port),
        log=workdir / "etcd.log",
    )
    apiserver = Process(
        name="kube-apiserver",
        args=[
            *_apiserver_args(
                binaries.kube_apiserver,
                pki.dir,
                etcd_port=etcd_port,
                address=settings.address,
                port=apiserver_port,
            ),
            *settings.apiserver_flags,
        ],
        log=workdir / "kube-apiserver.log",
    )
    controllers = Process(
        name="kube-controller-manager",
        args=[
            *_controller_manager_args(
                binaries.kube_controller_manager, admin_kubeconfig, settings.controllers
            ),
            *settings.controller_flags,
        ],
        log=workdir / "kube-controller-manager.log",
    )
    return ControlPlane(
        binaries=binaries,
        workdir=workdir,
        url=url,
        admin_kubeconfig=admin_kubeconfig,
        server_ca=pki.file("server-ca.crt"),
        client_ca=pki.client_ca,
        front_proxy_ca=pki.front_proxy_ca,
        front_proxy_client=pki.front_proxy_client,
        users={user.name: user for user in credentials.STATIC_USERS},
        _etcd=etcd,
        _apiserver=apiserver,
        _controllers=controllers,
        _admin_cert=pki.file("admin.crt"),
        _admin_key=pki.file("admin.key"),
    )


def _etcd_args(binary: Path, data: Path, port: int, peer_port: int) -> list[str]:
    client_url = f"http://127.0.0.1:{port}"
    peer_url = f"http://127.0.0.1:{peer_port}"
    return [
        str(binary),
        "--name=e2e",
        f"--data-dir={data}",
        f"--listen-client-urls={client_url}",
        f"--advertise-client-urls={client_url}",
        f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=e2e={peer_url}",
        # Throwaway data: durability is not worth an fsync per write on a busy disk.
        "--unsafe-no-fsync",
        "--log-level=warn",
    ]


def _apiserver_args(
    binary: Path, pki: Path, *, etcd_port: int, address: str, port: int
) -> list[str]:
    return [
        str(binary),
        f"--etcd-servers=http://127.0.0.1:{etcd_port}",
        f"--bind-address={address}",
        f"--secure-port={port}",
        # On loopback, the `kubernetes` Service is never dialled (the aggregator
        # routes it to loopback itself), and Endpoints may not hold a loopback
        # address: keep no Endpoints for it (a cluster with pods says otherwise).
        f"--advertise-address={address}",
        "--endpoint-reconciler-type=none",
        "--service-cluster-ip-range=10.0.0.0/24",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--cert-dir={pki}",
        f"--client-ca-file={pki / 'client-ca.crt'}",
        f"--token-auth-file={pki / 'tokens.csv'}",
        f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        "--authorization-mode=Node,RBAC",
        f"--requestheader-client-ca-file={pki / 'front-proxy-ca.crt'}",
        f"--requestheader-allowed-names={credentials.FRONT_PROXY_CLIENT}",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
        f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
        f"--kubelet-client-certificate={pki / 'kubelet-client.crt'}",
        f"--kubelet-client-key={pki / 'kubelet-client.key'}",
        # ExternalName Services route only through the cluster-IP resolver.
        "--enable-aggregator-routing=false",
        "--profiling=false",
        "--v=1",
    ]


def _controller_manager_args(binary: Path, kubeconfig: Path, controllers: str) -> list[str]:
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        # By default only what a cluster's RBAC needs and nothing here provides otherwise:
        # the built-in admin, edit and view roles gather the rules labelled for them.
        f"--controllers={controllers}",
        "--leader-elect=false",
        "--secure-port=0",
        "--v=1",
    ]


def free_ports(count: int, *, address: str = "127.0.0.1") -> list[int]:
    """Ports the kernel just handed out on `address` (all held until every one is chosen)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((address, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _object_path(obj: Mapping[str, Any]) -> str:
    """The REST path of one object of the few kinds the helpers apply."""
    kind = obj["kind"]
    meta = obj["metadata"]
    plural = {
        "Namespace": "namespaces",
        "Service": "services",
        "ServiceAccount": "serviceaccounts",
        "APIService": "apiservices",
        "ClusterRole": "clusterroles",
        "ClusterRoleBinding": "clusterrolebindings",
        "Role": "roles",
        "RoleBinding": "rolebindings",
    }[kind]
    api_version = obj["apiVersion"]
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    namespace = meta.get("namespace")
    scope = f"/namespaces/{namespace}" if namespace else ""
    return f"{prefix}{scope}/{plural}/{meta['name']}"
