"""A real two-node Kubernetes cluster on this machine, brought up and torn down by the tests.

Owns the cluster's life: the host's state captured first (and saved, so a
killed run is undone by the next one, or by ``python -m tests.cluster
cleanup``), the network (``network.py``), the control plane (the e2e suite's
``controlplane``, here with every controller, PodSecurity admission enforcing
``restricted`` by default, aggregator routing to pod addresses, and
kube-apiserver bound to and advertising the bridge's address), kube-scheduler,
and the nodes (``node.py``); images imported into every node; and a teardown
that deletes every pod, stops every process we started, kills whatever is left
in the cluster's cgroups, unmounts, removes the network and cgroups, undoes
what the kubelets changed (``hoststate.py``) and fails if anything differs
from before.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from subres.serving import certs
from tests import gotools
from tests.cluster import cgroups, hoststate, network
from tests.cluster.node import Node, NodeBinaries
from tests.e2e import controlplane, credentials
from tests.e2e.controlplane import ControlPlane, ControlPlaneError, Process, poll

__all__ = [
    "NODE_NAMES",
    "Cluster",
    "ClusterError",
    "build_node_binaries",
    "cleanup_stale",
    "launch",
    "running_cluster",
]

NODE_NAMES = ("node-a", "node-b")
LOCK_TIMEOUT_S = 1800.0
"""How long a cluster waits for another one on this machine to go (one at a time:
they would share the bridge, the namespaces and the addresses)."""
NODE_READY_TIMEOUT_S = 120.0
"""Bound on both kubelets registering Ready on a busy 2-core machine."""
PODS_GONE_TIMEOUT_S = 60.0


class ClusterError(ControlPlaneError):
    """The cluster could not be brought up, used or torn down; carries the logs."""


def state_file() -> Path:
    """Where the host's state before the cluster is kept while one runs."""
    return gotools.cache_dir() / "cluster" / "host-state.json"


def build_node_binaries() -> tuple[controlplane.Binaries, NodeBinaries, Path]:
    """The control plane's and the nodes' programs, and kube-scheduler (built once, cached)."""
    try:
        return (
            controlplane.build_binaries(),
            NodeBinaries(kubelet=gotools.build("kubelet"), kube_proxy=gotools.build("kube-proxy")),
            gotools.build("kube-scheduler"),
        )
    except gotools.GoBuildError as exc:
        raise ClusterError(f"cannot build the cluster's programs:\n{exc}") from exc


@dataclass
class Cluster:
    """A running cluster and what it takes to undo it."""

    plane: ControlPlane
    nodes: list[Node]
    scheduler: Process
    workdir: Path
    cgroup: str
    before: hoststate.HostState
    lock: int
    """The machine-wide cluster lock's file descriptor, held until `stop` ends."""

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    async def import_image(self, archive: Path) -> None:
        """Import an OCI archive into every node's containerd (namespace k8s.io)."""
        for node in self.nodes:
            await asyncio.to_thread(node.ctr, "images", "import", str(archive))

    async def restart_apiserver(self) -> None:
        """Stop kube-apiserver and start it again (same flags, address, data), in our cgroup."""
        await self.plane.restart_apiserver()
        self._adopt_control_plane()

    def _adopt_control_plane(self) -> None:
        """Put the control plane's processes in the cluster's cgroup (a killed run's
        leftovers are found there)."""
        pids = self.plane.pids()
        if self.scheduler.popen is not None:
            pids.append(self.scheduler.popen.pid)
        for pid in pids:
            cgroups.move(pid, f"{self.cgroup}/control-plane")

    async def wait_nodes_ready(self, timeout_s: float = NODE_READY_TIMEOUT_S) -> None:
        async def ready() -> bool:
            for node in self.nodes:
                for process in node.processes():
                    if process.exited() is not None:
                        raise self.failure(f"{process.name} exited with {process.exited()}")
            nodes = await self.plane.api("GET", "/api/v1/nodes")
            ready = {
                n["metadata"]["name"]
                for n in nodes["items"]
                if any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in n["status"].get("conditions", [])
                )
            }
            return ready >= {n.name for n in self.nodes}

        if not await poll(ready, timeout_s=timeout_s):
            raise self.failure(f"nodes not Ready within {timeout_s:.0f}s")

    def failure(self, reason: str) -> ClusterError:
        logs = "\n".join(n.logs() for n in self.nodes)
        return ClusterError(f"{reason}\n{self.plane.logs()}\n{self.scheduler.tail()}\n{logs}")

    async def stop(self) -> None:
        """Tear everything down and check the host is as it was; raise naming what is not."""
        try:
            problems = await _teardown(self)
        finally:
            os.close(self.lock)
        if problems:
            raise ClusterError("teardown left the host changed:\n" + "\n".join(problems))


@contextlib.asynccontextmanager
async def running_cluster() -> AsyncIterator[Cluster]:
    cluster = await launch()
    try:
        yield cluster
    finally:
        await cluster.stop()


async def launch(names: Sequence[str] = NODE_NAMES) -> Cluster:
    """Bring a cluster up and wait until every node is Ready; the caller must ``stop()`` it."""
    plane_binaries, node_binaries, scheduler = await asyncio.to_thread(build_node_binaries)
    lock = await _lock()
    try:
        return await _launch(names, plane_binaries, node_binaries, scheduler, lock)
    except BaseException:
        os.close(lock)
        raise


async def _lock() -> int:
    """Take the machine-wide cluster lock, waiting for another cluster to go."""
    path = state_file().with_name("lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)

    async def taken() -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    if not await poll(taken, timeout_s=LOCK_TIMEOUT_S):
        os.close(fd)
        raise ClusterError(f"another cluster has held {path} for {LOCK_TIMEOUT_S:.0f}s")
    return fd


async def _launch(
    names: Sequence[str],
    plane_binaries: controlplane.Binaries,
    node_binaries: NodeBinaries,
    scheduler: Path,
    lock: int,
) -> Cluster:
    problems = cleanup_stale()
    if problems:
        raise ClusterError(
            "a killed cluster's leftovers could not be removed:\n" + "\n".join(problems)
        )
    base = cgroups.base()
    before = hoststate.capture(cgroup_base=base)
    state_file().parent.mkdir(parents=True, exist_ok=True)
    state_file().write_text(before.to_json())
    cgroup = f"{base.rstrip('/')}/{cgroups.NAME}"
    workdir = Path(tempfile.mkdtemp(prefix="subres-cluster-"))
    nets = network.node_nets(names)
    nodes = [
        Node(net=net, dir=workdir / net.name, cgroup=f"{cgroup}/{net.name}", binaries=node_binaries)
        for net in nets
    ]
    cluster: Cluster | None = None
    try:
        cgroups.create(f"{cgroup}/control-plane")
        network.create_bridge()
        for net in nets:
            network.create_node(net, nets)
        admission = _write_admission_config(workdir)
        plane = await controlplane.launch(plane_binaries, _settings(admission))
        scheduler_process = Process(
            name="kube-scheduler",
            args=[
                str(scheduler),
                f"--kubeconfig={plane.admin_kubeconfig}",
                "--leader-elect=false",
                "--v=1",
            ],
            log=workdir / "kube-scheduler.log",
        )
        scheduler_process.start()
        cluster = Cluster(plane, nodes, scheduler_process, workdir, cgroup, before, lock)
        cluster._adopt_control_plane()
        await _start_nodes(cluster)
    except BaseException:
        if cluster is None:
            await _undo_partial(workdir, cgroup, before, nodes)
        else:
            await _teardown(cluster)
        raise
    return cluster


def _settings(admission: Path) -> controlplane.Settings:
    return controlplane.Settings(
        address=network.GATEWAY,
        apiserver_flags=(
            # Pods reach kube-apiserver through the `kubernetes` Service: keep its Endpoints.
            "--endpoint-reconciler-type=lease",
            # The aggregator dials the subres pods' addresses (EndpointSlices), as the
            # issue's probe did; no Service IP is routed on this host.
            "--enable-aggregator-routing=true",
            f"--admission-control-config-file={admission}",
            "--enable-admission-plugins=NodeRestriction",
            # The QEMU example's pod asks for /dev/kvm, which needs a privileged container.
            "--allow-privileged=true",
            # No DNS knows the nodes' names: logs, exec and port-forward dial their IPs.
            "--kubelet-preferred-address-types=InternalIP",
        ),
        controllers="*",
        controller_flags=("--allocate-node-cidrs=false", "--node-monitor-grace-period=20s"),
    )


def _write_admission_config(workdir: Path) -> Path:
    """PodSecurity enforcing `restricted` wherever a namespace does not say otherwise."""
    level = {
        "enforce": "restricted",
        "enforce-version": "latest",
        "audit": "restricted",
        "audit-version": "latest",
        "warn": "restricted",
        "warn-version": "latest",
    }
    config = {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "AdmissionConfiguration",
        "plugins": [
            {
                "name": "PodSecurity",
                "configuration": {
                    "apiVersion": "pod-security.admission.config.k8s.io/v1",
                    "kind": "PodSecurityConfiguration",
                    "defaults": level,
                    "exemptions": {"usernames": [], "runtimeClasses": [], "namespaces": []},
                },
            }
        ],
    }
    path = workdir / "admission.json"
    path.write_text(json.dumps(config))
    return path


async def _start_nodes(cluster: Cluster) -> None:
    plane = cluster.plane
    pki = plane.server_ca.parent
    for node in cluster.nodes:
        kubelet = certs.issue_client(
            plane.client_ca, user=f"system:node:{node.name}", groups=["system:nodes"]
        )
        proxy = certs.issue_client(plane.client_ca, user="system:kube-proxy", groups=[])
        node.write_config(
            server=plane.url,
            ca=plane.server_ca,
            client_ca=pki / "client-ca.crt",
            kubelet=_cert_user(kubelet),
            proxy=_cert_user(proxy),
        )
        node.start_runtime()
    pause = await asyncio.to_thread(_pause_image)
    for node in cluster.nodes:
        if not await poll(_exists(node.socket), timeout_s=30.0):
            raise cluster.failure(f"{node.name}: containerd did not listen")
    await cluster.import_image(pause)
    for node in cluster.nodes:
        node.start_node()
    await cluster.wait_nodes_ready()


def _pause_image() -> Path:
    from tests.cluster import images  # the builder drives mmdebstrap; import it when needed

    return images.pause()


def _exists(path: Path) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return await asyncio.to_thread(path.exists)

    return check


def _cert_user(pair: certs.KeyPair) -> dict[str, str]:
    return credentials.cert_user_entry(pair)


# -- teardown ---------------------------------------------------------------------------


async def _teardown(cluster: Cluster) -> list[str]:
    with contextlib.suppress(Exception):
        await _delete_all_pods(cluster)
    for node in cluster.nodes:
        for process in node.processes():
            await process.stop()
    await cluster.scheduler.stop()
    await cluster.plane.stop()
    return await _undo_partial(cluster.workdir, cluster.cgroup, cluster.before, cluster.nodes)


async def _delete_all_pods(cluster: Cluster) -> None:
    """Stop the controllers, delete every pod now, and wait until no node runs a container."""
    await cluster.scheduler.stop()
    plane = cluster.plane
    await plane.stop_controllers()
    pods = await plane.api("GET", "/api/v1/pods")
    for pod in pods["items"]:
        meta = pod["metadata"]
        with contextlib.suppress(controlplane.APIError):
            await plane.api(
                "DELETE",
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                params={"gracePeriodSeconds": "0"},
            )

    async def drained() -> bool:
        # Every task stopped: the kubelet has killed the containers and stopped the
        # sandboxes (their networks torn down); it removes what is left on its next
        # garbage collection, a minute later, which teardown does not wait for.
        for node in cluster.nodes:
            if node.containerd is None or node.containerd.exited() is not None:
                continue
            listed = await asyncio.to_thread(node.ctr, "tasks", "list")
            if any(line.split()[-1] != "STOPPED" for line in listed.splitlines()[1:] if line):
                return False
        return True

    await poll(drained, timeout_s=PODS_GONE_TIMEOUT_S)


async def _undo_partial(
    workdir: Path, cgroup: str, before: hoststate.HostState, nodes: Sequence[Node]
) -> list[str]:
    """Kill what is left in our cgroups, unmount, remove network, cgroups and files; check."""
    for node in nodes:
        for process in node.processes():
            await process.stop()
    await asyncio.to_thread(cgroups.kill_all, cgroup)
    problems = await asyncio.to_thread(_unmount_under, workdir)
    problems += cgroups.remove(cgroup)
    problems += await asyncio.to_thread(hoststate.undo, before)
    shutil.rmtree(workdir, ignore_errors=True)
    problems += hoststate.differences(before, hoststate.capture(cgroup_base=before.cgroup_base))
    if not problems:
        state_file().unlink(missing_ok=True)
    return problems


def _unmount_under(root: Path) -> list[str]:
    """Unmount everything mounted under `root`, deepest first (the kubelet's volumes too)."""
    mounts = hoststate.mount_points()
    problems: list[str] = []
    for mount in sorted((m for m in mounts if m.startswith(f"{root}/")), key=len, reverse=True):
        if subprocess.run(["umount", mount], capture_output=True, check=False).returncode:
            lazy = subprocess.run(["umount", "-l", mount], capture_output=True, check=False)
            if lazy.returncode:
                problems.append(f"cannot unmount {mount}: {lazy.stderr.decode().strip()}")
    return problems


def cleanup_stale() -> list[str]:
    """Undo what a cluster whose run was killed left behind; what could not be undone."""
    path = state_file()
    if not path.is_file():
        return []
    before = hoststate.HostState.from_json(path.read_text())
    cgroup = f"{before.cgroup_base.rstrip('/')}/{cgroups.NAME}"
    cgroups.kill_all(cgroup)
    problems = cgroups.remove(cgroup) + hoststate.undo(before)
    for leftover in Path(tempfile.gettempdir()).glob("subres-cluster-*"):
        problems += _unmount_under(leftover)
        shutil.rmtree(leftover, ignore_errors=True)
    if not problems:
        path.unlink()
    return problems
