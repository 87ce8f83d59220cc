"""The real virtctl v1.7.0 through a real kube-apiserver, to subres serving the KubeVirt profile.

subres is deployed from examples/kubevirt (its overlay of deploy/: RBAC to
read VMIs and VMs, the `v1.subresources.kubevirt.io` APIService, the user and
`version` roles) with its minimal VMI and VM CRDs, and runs in cluster mode
with the shipped profile (socket directory and endpoint policy moved to the
test's). VMIs and VMs are real objects written through kube-apiserver, their
status through the status subresource. alice, bound to `subres-kubevirt-user`
in the namespace, runs virtctl with her own kubeconfig: kube-apiserver
authenticates and authorizes her, then proxies to subres, which checks again.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from subres.config import USB_SLOTS
from tests.e2e import subresserver
from tests.e2e.controlplane import ControlPlane, poll, run_sync
from tests.e2e.subresserver import Subres
from tests.gotools import virtctl
from tests.kubevirt import EXAMPLE, Backends, backends, profile, short_dir, vm, vmi
from tests.usbredir import FakeSlot
from tests.virtctl import TIMEOUT, Virtctl

NS = "e2e-kubevirt"
GROUP = "subresources.kubevirt.io"
KUBEVIRT = "/apis/kubevirt.io/v1"


@dataclass
class Cluster:
    plane: ControlPlane
    subres: Subres
    sockets: Path


@pytest.fixture(scope="module")
def cluster(control_plane: ControlPlane) -> Iterator[Cluster]:
    """subres with the KubeVirt profile, registered and Available; alice may use VMIs in NS."""
    with short_dir() as sockets:
        config = sockets / "config.yaml"
        settings = {
            **profile(sockets),
            "endpointPolicy": {
                "allowCIDRs": ["127.0.0.0/8"],
                "denyCIDRs": [],
                "socketDirs": [str(sockets)],
            },
        }
        config.write_text(yaml.safe_dump(settings))
        kubevirt = subresserver.Profile(
            overlay=EXAMPLE.relative_to(subresserver.REPO),
            certs=EXAMPLE.relative_to(subresserver.REPO) / "certs",
            apiservice=f"v1.{GROUP}",
            crds=("virtualmachineinstances.kubevirt.io", "virtualmachines.kubevirt.io"),
            resources=(EXAMPLE / "crds.yaml",),
            config=config,
            # The --timeout test sees virtctl's refused attempts in the access log.
            args=("--access-log",),
        )
        server = run_sync(subresserver.launch(control_plane, kubevirt))
        try:
            run_sync(_bind_alice(control_plane))
            yield Cluster(control_plane, server, sockets)
        finally:
            run_sync(subresserver.shutdown(server))


async def _bind_alice(plane: ControlPlane) -> None:
    await plane.ensure_namespace(NS)
    (
        await plane.kubectl(
            "create", "rolebinding", "alice-vms", "-n", NS,
            "--clusterrole=subres-kubevirt-user", "--user=alice",
        )
    ).check()  # fmt: skip

    async def bound() -> bool:
        answer = await plane.kubectl(
            "auth", "can-i", "get", f"virtualmachineinstances.{GROUP}",
            "--subresource=console", "-n", NS, "--as=alice",
        )  # fmt: skip
        return answer.stdout.strip() == "yes"

    assert await poll(bound, timeout_s=20.0), "the RoleBinding never took effect"


async def create(plane: ControlPlane, obj: dict[str, Any]) -> str:
    """Create `obj` (a VMI or VM) and set its status through the status subresource; its uid."""
    plural = obj["kind"].lower() + "s"
    status = obj.pop("status")
    made = await plane.api("POST", f"{KUBEVIRT}/namespaces/{NS}/{plural}", obj)
    name = obj["metadata"]["name"]
    await plane.api(
        "PATCH",
        f"{KUBEVIRT}/namespaces/{NS}/{plural}/{name}/status",
        {"status": status},
        content_type="application/merge-patch+json",
    )
    return str(made["metadata"]["uid"])


async def set_phase(plane: ControlPlane, name: str, phase: str) -> None:
    await plane.api(
        "PATCH",
        f"{KUBEVIRT}/namespaces/{NS}/virtualmachineinstances/{name}/status",
        {"status": {"phase": phase}},
        content_type="application/merge-patch+json",
    )


@dataclass
class Machine:
    """A VM and its running VMI in NS, their backends, and alice's virtctl."""

    name: str
    backends: Backends
    virtctl: Virtctl


_names = itertools.count(1)


@pytest.fixture
async def machine(cluster: Cluster, tmp_path: Path) -> AsyncIterator[Machine]:
    name = f"vm{next(_names)}"
    plane = cluster.plane
    vm_uid = await create(plane, vm(name, namespace=NS))
    passthrough: dict[str, Any] = {"clientPassthrough": {}}
    uid = await create(plane, vmi(name, owner=vm_uid, namespace=NS, devices=passthrough))
    async with backends(cluster.sockets, uid) as b:
        alice = Virtctl(virtctl(), plane.kubeconfig_for("alice"), tmp_path, namespace=NS)
        await _wait_served(alice, name)
        yield Machine(name, b, alice)


async def _wait_served(alice: Virtctl, name: str) -> None:
    """Until the VMI reached subres's watch cache: its screenshot succeeds."""

    async def served() -> bool:
        code, _, _ = await alice.run("vnc", "screenshot", name, "-f", "-")
        return code == 0

    assert await poll(served, timeout_s=TIMEOUT), f"{name} never served"


async def test_version_through_kube_apiserver(cluster: Cluster, tmp_path: Path) -> None:
    alice = Virtctl(virtctl(), cluster.plane.kubeconfig_for("alice"), tmp_path, namespace=NS)
    await alice.version(server="v1.7.0")
    await alice.error_without_noise("nosuch")


async def test_console_typing(machine: Machine) -> None:
    await machine.virtctl.console_types(machine.name)


async def test_usbredir_no_launch_each_slot_then_a_takeover(machine: Machine) -> None:
    await machine.virtctl.usbredir_takeover(machine.name, device=FakeSlot.VERSION, slots=USB_SLOTS)


async def test_console_with_timeout_waits_for_running(cluster: Cluster, tmp_path: Path) -> None:
    plane = cluster.plane
    uid = await create(plane, vmi("later", phase="Scheduling", namespace=NS))
    log = cluster.subres.workdir / "subres.log"
    refused_line = re.compile(rb'virtualmachineinstances/later/console HTTP/1\.1" 400 ')

    async def refused() -> None:
        async def seen() -> bool:
            return refused_line.search(log.read_bytes()) is not None

        assert await poll(seen, timeout_s=TIMEOUT), cluster.subres.logs()

    async with backends(cluster.sockets, uid):
        alice = Virtctl(virtctl(), plane.kubeconfig_for("alice"), tmp_path, namespace=NS)
        await alice.console_waits_for_running(
            "later", refused=refused, start=lambda: set_phase(plane, "later", "Running")
        )


async def test_vnc_proxy_only_and_screenshot(machine: Machine) -> None:
    await machine.virtctl.vnc_proxy_only(machine.name, machine.backends.display)
    await machine.virtctl.screenshot(machine.name, machine.backends.display)


@pytest.mark.parametrize("kind", ["vmi", "vm"])
async def test_port_forward_tcp_udp_and_stdio(machine: Machine, kind: str) -> None:
    echo = int(machine.backends.echo.url.rsplit(":", 1)[1])
    target = f"{kind}/{machine.name}"
    await machine.virtctl.forward_tcp(target, echo)
    await machine.virtctl.forward_udp(target, machine.backends.udp.port)
    await machine.virtctl.forward_stdio(target, echo)
    assert machine.backends.echo.accepted == 2


async def test_a_user_without_the_role_is_refused_by_kube_apiserver(
    machine: Machine, cluster: Cluster, tmp_path: Path
) -> None:
    bob = Virtctl(virtctl(), cluster.plane.kubeconfig_for("bob"), tmp_path, namespace=NS)
    code, _, err = await bob.run("vnc", "screenshot", machine.name, "-f", "-")
    assert code == 1 and b"forbidden" in err.lower(), err
