"""The real subres, installed from ``deploy/`` (or an overlay of it) as the README says.

Owns what it takes to put ``subres serve`` (cluster mode) behind a real
kube-apiserver on this machine, following the README's install steps in a
copy of ``deploy/`` (so that generated keys never land in the checkout):

- ``subres certs --out deploy/certs`` writes the kustomize component with
  the serving, agent and replica certificates and the APIService caBundle;
- ``kubectl apply -k`` applies ``deploy/self-signed`` (a `Profile` may name another
  overlay, such as ``examples/kubevirt``) through an overlay that
  changes only what cannot exist here: the Service becomes an ExternalName
  Service for 127.0.0.1 (see ``aggregation.py`` for why that reaches a local
  process) and the APIService's port is the local one. Everything else is
  created as shipped: namespace, CRD, RBAC, the Deployment and the agent
  DaemonSet (which no controller runs here), Secrets, APIService;
- the process runs with a kubeconfig holding a TokenRequest token of the
  ``subres-system/subres`` ServiceAccount, so it has exactly the permissions
  ``deploy/`` grants it, and without ``--requestheader-*`` flags, so it reads
  ``kube-system/extension-apiserver-authentication`` as in a cluster. It uses
  the certificates the Deployment mounts, the agent ones included.

It is started and stopped by PID (``controlplane.Process``); every wait is
bounded and fails with the logs of both subres and kube-apiserver.

``replica`` starts a second process beside a launched one, with the same
credentials, certificates and flags on a port of its own: another replica of
the same Deployment. kube-apiserver still reaches only the first (an
ExternalName Service is one address); tests reach the second as
kube-apiserver would, with its front-proxy certificate.
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import yaml

from subres.serving import certs
from tests.e2e.aggregation import apiservice_condition, wait_apiservice_available
from tests.e2e.controlplane import (
    ControlPlane,
    ControlPlaneError,
    Process,
    free_ports,
    output_of,
    poll,
)
from tests.support import LOOPBACK_POLICY

__all__ = [
    "AGENT_NAMESPACE",
    "APISERVICE",
    "GROUP",
    "NAMESPACE",
    "REPO",
    "SERVER_NAME",
    "SERVICE",
    "VERSION",
    "Profile",
    "Subres",
    "launch",
    "replica",
    "shutdown",
]

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"

GROUP = "subresources.subres.dev"
VERSION = "v1alpha1"
APISERVICE = f"{VERSION}.{GROUP}"
NAMESPACE = "subres-system"
AGENT_NAMESPACE = "subres-agents"
"""Where deploy/ runs the node agents (their hostPath needs a `privileged` namespace)."""
SERVICE = "subres"
SERVICE_ACCOUNT = "subres"
SERVER_NAME = f"{SERVICE}.{NAMESPACE}.svc"
"""The TLS server name kube-apiserver dials the Service by; the certificate must name it."""

READY_TIMEOUT_S = 30.0
"""Bound on subres answering ``/readyz`` after it was started."""
AVAILABLE_TIMEOUT_S = 45.0
"""Bound on the APIService turning Available: the aggregator retries a failed probe
with a growing delay and re-checks every APIService every 30 s at the latest."""


@dataclass(frozen=True)
class Profile:
    """What to install: ``deploy/self-signed``, or another overlay such as examples/kubevirt."""

    overlay: Path = Path("deploy/self-signed")
    """The kustomization applied, relative to the checkout (copied, with ``deploy/``)."""
    certs: Path = Path("deploy/certs")
    """Where ``subres certs`` writes the overlay's certificate component (relative too)."""
    apiservice: str = APISERVICE
    """The APIService it registers."""
    crds: tuple[str, ...] = ("machines.subres.dev",)
    """CRDs to wait for before starting subres."""
    resources: tuple[Path, ...] = ()
    """Further manifests to apply with it (CRDs of a cluster without the real operator)."""
    config: Path | None = None
    """``--config`` of the local process (the overlay's ConfigMap would need a kubelet)."""
    args: tuple[str, ...] = ()
    """Further flags of ``subres serve`` (e.g. ``--access-log`` for a test that reads it)."""
    source: Path | None = None
    """Another checkout whose ``subres`` to run (a benchmark's older design); it has no
    peer port."""


@dataclass
class Subres:
    """A running ``subres serve`` registered with the control plane."""

    plane: ControlPlane
    """The control plane it serves behind."""
    workdir: Path
    """Temporary directory: overlay, certificates, cert-dir, log."""
    port: int
    """Port on 127.0.0.1 (fixed across restarts, as behind a Service)."""
    ca: Path
    """CA of the serving certificate (the APIService's caBundle)."""
    process: Process
    """The ``python -m subres serve`` child."""
    cert_files: Path
    """The certificates as ``subres certs`` wrote them (agents use its ``agent.*``)."""
    apiservice: str = APISERVICE
    """The APIService it is registered by."""

    @property
    def peer_port(self) -> int:
        """The port where it serves the other replicas (``--peer-port``)."""
        flag = next(a for a in self.process.args if a.startswith("--peer-port="))
        return int(flag.split("=", 1)[1])

    @property
    def url(self) -> str:
        """``https://127.0.0.1:<port>``: subres itself, bypassing kube-apiserver."""
        return f"https://127.0.0.1:{self.port}"

    def ssl_context(self, client: certs.KeyPair | None = None) -> ssl.SSLContext:
        """Trusts subres's serving CA; presents `client`'s certificate when given.

        Connections must use ``server_hostname=SERVER_NAME``: the certificate
        names the Service, not 127.0.0.1, as ``subres certs`` makes it.
        """
        context = ssl.create_default_context(cafile=str(self.ca))
        if client is not None:
            name = client.cert.serial_number
            cert, key = self.workdir / f"client-{name}.crt", self.workdir / f"client-{name}.key"
            client.write(cert, key)
            context.load_cert_chain(cert, key)
        return context

    async def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Poll subres's ``/readyz`` (anonymous) until 200; raise with the logs otherwise."""
        context = self.ssl_context()

        async def ready() -> bool:
            if self.process.exited() is not None:
                raise self.failure(f"subres exited with {self.process.exited()}")
            try:
                async with (
                    aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session,
                    session.get(
                        self.url + "/readyz", ssl=context, server_hostname=SERVER_NAME
                    ) as response,
                ):
                    return response.status == 200
            except (aiohttp.ClientError, TimeoutError):
                return False

        if not await poll(ready, timeout_s=timeout_s):
            raise self.failure(f"subres not ready within {timeout_s:.0f}s")

    async def wait_available(self, timeout_s: float = AVAILABLE_TIMEOUT_S) -> None:
        """Wait until the APIService is ``Available=True``; raise with the logs otherwise."""
        try:
            await wait_apiservice_available(self.plane, self.apiservice, timeout_s=timeout_s)
        except ControlPlaneError as exc:
            raise self.failure(str(exc)) from None

    async def available_status(self) -> str | None:
        """The APIService's ``Available`` condition status (``"True"``, ``"False"``…)."""
        condition = await apiservice_condition(self.plane, self.apiservice)
        return None if condition is None else str(condition.get("status"))

    async def start(self) -> None:
        """Start the process and wait until it is ready."""
        self.process.start()
        await self.wait_ready()

    async def stop(self) -> None:
        """SIGTERM (then SIGKILL) by PID."""
        await self.process.stop()

    def failure(self, reason: str) -> ControlPlaneError:
        """An error naming `reason` with the tails of the subres and control-plane logs."""
        return ControlPlaneError(f"{reason}\n{self.process.tail()}\n{self.plane.logs()}")

    def logs(self) -> str:
        """The tail of subres's log and of the control plane's, for a failing assertion."""
        return f"{self.process.tail()}\n{self.plane.logs()}"


async def launch(plane: ControlPlane, profile: Profile = Profile()) -> Subres:
    """Install ``profile`` (see the module docstring), start subres, wait for Available.

    The caller must ``shutdown()`` the result.
    """
    workdir = Path(tempfile.mkdtemp(prefix="subres-e2e-server-"))
    try:
        port, peer_port = free_ports(2)
        trees = [Path("deploy")]
        if not profile.overlay.is_relative_to("deploy"):
            trees.append(profile.overlay)
        for tree in trees:
            shutil.copytree(REPO / tree, workdir / tree, ignore=shutil.ignore_patterns("certs"))
        certs_dir = workdir / profile.certs
        await _subres_certs(workdir, profile.certs, profile.apiservice)
        _write_kustomization(workdir, port, profile)
        (await plane.kubectl("apply", "--server-side", "-k", str(workdir / "e2e"))).check()
        for crd in profile.crds:
            (
                await plane.kubectl(
                    "wait", "--for=condition=Established", f"crd/{crd}", "--timeout=30s"
                )
            ).check()
        token = await plane.service_account_token(NAMESPACE, SERVICE_ACCOUNT)
        kubeconfig = plane.token_kubeconfig("subres-server", token)
        args = _serve_args(certs_dir, workdir / "cert-dir", kubeconfig, port)
        if profile.source is None:  # flags an older checkout (a bench's) does not know
            args += [f"--peer-port={peer_port}", f"--agent-namespace={AGENT_NAMESPACE}"]
        args.append(f"--config={profile.config or _write_config(workdir)}")
        args += profile.args
        server = Subres(
            plane=plane,
            workdir=workdir,
            port=port,
            ca=certs_dir / "ca.crt",
            process=Process(
                name="subres", args=args, log=workdir / "subres.log", cwd=profile.source
            ),
            cert_files=certs_dir,
            apiservice=profile.apiservice,
        )
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    try:
        await server.start()
        await server.wait_available()
    except BaseException:
        await shutdown(server)
        raise
    return server


async def replica(first: Subres, name: str) -> Subres:
    """Start another replica beside `first` (same flags, its own port and cert-dir), ready.

    The caller stops it (``stop()``); ``shutdown(first)`` removes the shared files.
    """
    port, peer_port = free_ports(2)
    swapped = {
        "--secure-port": str(port),
        "--cert-dir": str(first.workdir / f"cert-dir-{name}"),
        "--replica-name": name,
    }
    if any(a.startswith("--peer-port=") for a in first.process.args):
        swapped["--peer-port"] = str(peer_port)
    args = [a for a in first.process.args if a.split("=", 1)[0] not in swapped]
    server = Subres(
        plane=first.plane,
        workdir=first.workdir,
        port=port,
        ca=first.ca,
        apiservice=first.apiservice,
        cert_files=first.cert_files,
        process=Process(
            name=f"subres {name}",
            args=[*args, *(f"{flag}={value}" for flag, value in swapped.items())],
            log=first.workdir / f"subres-{name}.log",
            cwd=first.process.cwd,
        ),
    )
    try:
        await server.start()
    except BaseException:
        await server.stop()
        raise
    return server


async def replica_pod(server: Subres, name: str) -> None:
    """The Pod the Deployment would run as replica `name`, Ready at 127.0.0.1 (as a kubelet
    would report it), its `peer` port the one `server` listens on: how the others find it."""
    plane = server.plane
    deployment = await plane.api("GET", f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/subres")
    template = deployment["spec"]["template"]
    spec = dict(template["spec"])
    [container] = spec["containers"]
    [peer] = [p for p in container["ports"] if p["name"] == "peer"]
    peer["containerPort"] = server.peer_port
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": template["metadata"]["labels"],
        },
        "spec": spec,
    }
    (await plane.kubectl("apply", "-f", "-", stdin=json.dumps(pod))).check()
    await set_pod_ready(plane, name, ready=True)


async def set_pod_ready(plane: ControlPlane, name: str, *, ready: bool) -> None:
    """Report replica Pod `name` Ready or not, as its kubelet would."""
    status = {
        "status": {
            "phase": "Running",
            "podIP": "127.0.0.1",
            "podIPs": [{"ip": "127.0.0.1"}],
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        }
    }
    (
        await plane.kubectl(
            "patch", "pod", name, "-n", NAMESPACE, "--subresource=status",
            "--type=merge", "-p", json.dumps(status),
        )
    ).check()  # fmt: skip


async def shutdown(server: Subres) -> None:
    """Stop subres, unregister its APIService (the group would answer 503), remove files."""
    try:
        await server.stop()
        await server.plane.api(
            "DELETE", f"/apis/apiregistration.k8s.io/v1/apiservices/{server.apiservice}"
        )
    finally:
        shutil.rmtree(server.workdir, ignore_errors=True)


def _serve_args(certs_dir: Path, cert_dir: Path, kubeconfig: Path, port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "subres",
        "serve",
        f"--kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--tls-cert-file={certs_dir / 'tls.crt'}",
        f"--tls-private-key-file={certs_dir / 'tls.key'}",
        # As the Deployment says: the replicas' side of their mutual TLS with the agents.
        f"--agent-ca-file={certs_dir / 'ca.crt'}",
        f"--agent-client-cert-file={certs_dir / 'replica.crt'}",
        f"--agent-client-key-file={certs_dir / 'replica.key'}",
        # Where the CA bundles read from the authentication ConfigMap are written.
        f"--cert-dir={cert_dir}",
        # No endpoints to wait for here (tests/server/test_drain_replicas.py has the delay).
        "--shutdown-delay=0s",
        "--shutdown-grace=2",
    ]


def _write_config(workdir: Path) -> Path:
    """The server's `--config` when the profile has none: an endpoint policy for the
    backends, all on loopback (which the default policy denies)."""
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump({"endpointPolicy": LOOPBACK_POLICY}))
    return path


def _write_kustomization(workdir: Path, port: int, profile: Profile) -> None:
    """The profile's overlay plus what a server on this machine needs instead of a pod."""
    overlay = workdir / "e2e"
    overlay.mkdir()
    for path in profile.resources:  # kustomize loads files from under the overlay only
        shutil.copy(path, overlay / path.name)
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [
            os.path.relpath(workdir / profile.overlay, overlay),
            *(p.name for p in profile.resources),
        ],
        "patches": [
            {
                "patch": _yaml(
                    {
                        "apiVersion": "v1",
                        "kind": "Service",
                        "metadata": {"name": SERVICE, "namespace": NAMESPACE},
                        "spec": {
                            "type": "ExternalName",
                            "externalName": "127.0.0.1",
                            "selector": None,
                        },
                    }
                )
            },
            {
                "patch": _yaml(
                    {
                        "apiVersion": "apiregistration.k8s.io/v1",
                        "kind": "APIService",
                        "metadata": {"name": profile.apiservice},
                        "spec": {"service": {"port": port}},
                    }
                )
            },
        ],
    }
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))


async def _subres_certs(cwd: Path, out: Path, apiservice: str) -> None:
    """Run the real ``subres certs --out <overlay's certs>`` verb in `cwd`, as the README says."""
    code, output = await output_of(
        sys.executable, "-m", "subres", "certs", f"--service={SERVICE}",
        f"--namespace={NAMESPACE}", f"--out={out}", f"--apiservice={apiservice}",
        cwd=cwd, timeout_s=60,
    )  # fmt: skip
    if code != 0:
        raise ControlPlaneError(f"subres certs exited {code}: {output}")


def _yaml(obj: dict[str, object]) -> str:
    return yaml.safe_dump(obj)
