"""deploy/chart installed, upgraded under a live console and uninstalled on the real cluster.

The three steps are docs/operating.md's "Install with Helm" blocks, run word for word
with our Helm (tests.gotools) and kubectl; the upgrade goes to the second image of the
session (``install.NEXT_TAG``, put for the docs' example tag) while a writer, an
observer and a port-forward use the VM, as tests/cluster/test_vm_rollouts.py rolls the
kustomize install. The module leaves the cluster as it found it (no subres, no CRD, no
VM), so that the kustomize install of the later modules starts clean; it refuses to run
on a cluster where subres is installed already.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests import gotools
from tests.cluster import install, live, vm
from tests.cluster.cluster import Cluster
from tests.cluster.conftest import SubresImages
from tests.e2e.controlplane import APIError, poll, run_sync

pytestmark = pytest.mark.timeout(900)

SECTION = "Install with Helm"
DOCS_TAG = "0.1.1"
"""The tag the docs' upgrade example names; the test goes to ``install.NEXT_TAG``."""
CRD = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/machines.subres.dev"
APISERVICE = f"/apis/apiregistration.k8s.io/v1/apiservices/{install.APISERVICE}"
GONE_TIMEOUT_S = 180.0
RECOVER_S = 60.0
"""Bound on users being served again by themselves (as test_vm_rollouts.py bounds it)."""


@dataclass(frozen=True)
class Release:
    workdir: Path
    install_output: str
    upgrade_script: str
    uninstall_script: str


@pytest.fixture(scope="module")
def release(cluster: Cluster, subres_images: SubresImages) -> Iterator[Release]:
    """The docs' Helm install, rolled out; afterwards nothing of it, nor the VM, is left."""
    assert not run_sync(_exists(cluster, APISERVICE)), "subres is installed already"
    workdir = install.workspace(cluster, helm=gotools.helm())
    upgrade, uninstall = install.docs_block(SECTION, "helm upgrade").splitlines()
    try:
        output = run_sync(
            install.run_block(cluster, install.docs_block(SECTION, "helm install"), workdir)
        )
        run_sync(install.rollout(cluster, "deployment", "subres", install.NAMESPACE))
        run_sync(install.rollout(cluster, "daemonset", "subres-agent", install.AGENT_NAMESPACE))
        yield Release(workdir, output, upgrade, uninstall)
    finally:
        run_sync(_clean(cluster, workdir, uninstall))
        shutil.rmtree(workdir)


async def _exists(cluster: Cluster, path: str) -> bool:
    try:
        await cluster.plane.api("GET", path)
    except APIError as exc:
        if exc.status == 404:
            return False
        raise
    return True


async def _wait_gone(cluster: Cluster, *paths: str) -> None:
    async def gone() -> bool:
        return not any([await _exists(cluster, p) for p in paths])

    if not await poll(gone, timeout_s=GONE_TIMEOUT_S):
        raise cluster.failure(f"still there after {GONE_TIMEOUT_S:.0f}s: {paths}")


async def _clean(cluster: Cluster, workdir: Path, uninstall: str) -> None:
    """Uninstall if a test did not, then remove what the release keeps and the VM."""
    listed = await install.run_block(cluster, "helm list -q", workdir)
    if "subres" in listed.split():
        await install.run_block(cluster, uninstall, workdir)
    await cluster.plane.kubectl("delete", "namespace", vm.NAMESPACE, "--ignore-not-found")
    await cluster.plane.kubectl("delete", "crd", "machines.subres.dev", "--ignore-not-found")
    await _wait_gone(cluster, CRD, f"/api/v1/namespaces/{vm.NAMESPACE}", *NAMESPACES)


NAMESPACES = [f"/api/v1/namespaces/{ns}" for ns in (install.NAMESPACE, install.AGENT_NAMESPACE)]


@pytest.fixture(scope="module")
def machine(cluster: Cluster, release: Release) -> vm.Vm:
    return run_sync(vm.start_vm(cluster))


def test_the_release_runs_two_replicas_an_agent_per_node_and_the_apiservice(
    cluster: Cluster, release: Release
) -> None:
    pods = run_sync(install.wait_pods(cluster, install.NAMESPACE, install.REPLICAS, count=2))
    assert {p["spec"]["nodeName"] for p in pods} == {"node-a", "node-b"}
    assert {p["spec"]["containers"][0]["image"] for p in pods} == {install.IMAGE}
    agents = run_sync(install.wait_pods(cluster, install.AGENT_NAMESPACE, install.AGENTS, count=2))
    assert sorted(p["spec"]["nodeName"] for p in agents) == ["node-a", "node-b"]
    service = run_sync(cluster.plane.api("GET", APISERVICE))
    available = [c for c in service["status"]["conditions"] if c["type"] == "Available"]
    assert available[0]["status"] == "True", available
    deployment = _deployment(cluster)
    assert deployment["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    assert deployment["metadata"]["annotations"]["meta.helm.sh/release-name"] == "subres"


@dataclass(frozen=True)
class Upgrade:
    outcome: live.Outcome
    images: set[str]
    revision: int


@pytest.fixture(scope="module")
def upgraded(
    cluster: Cluster,
    release: Release,
    machine: vm.Vm,
    tmp_path_factory: pytest.TempPathFactory,
) -> Upgrade:
    assert DOCS_TAG in release.upgrade_script
    script = release.upgrade_script.replace(DOCS_TAG, install.NEXT_TAG)

    async def upgrade(_: live.Live) -> None:
        await install.run_block(cluster, script, release.workdir)
        await install.rollout(cluster, "deployment", "subres", install.NAMESPACE)
        await install.rollout(cluster, "daemonset", "subres-agent", install.AGENT_NAMESPACE)
        # Rolled out means the new pods are Ready; the old ones drain for 25 s more.
        await install.wait_pods(cluster, install.NAMESPACE, install.REPLICAS, count=2)

    home = tmp_path_factory.mktemp("helm-upgrade")
    outcome = run_sync(live.observe(cluster, home, "helm upgrade to another image", upgrade))
    pods = run_sync(install.pods(cluster, install.NAMESPACE, install.REPLICAS))
    history = run_sync(install.run_block(cluster, "helm history subres -o json", release.workdir))
    [*_, last] = json.loads(history)
    assert last["status"] == "deployed", last
    return Upgrade(outcome, {p["spec"]["containers"][0]["image"] for p in pods}, last["revision"])


def test_the_upgrade_goes_to_the_other_image_with_the_installed_certificates(
    cluster: Cluster, upgraded: Upgrade
) -> None:
    assert upgraded.images == {f"{install.IMAGE.rsplit(':', 1)[0]}:{install.NEXT_TAG}"}
    assert upgraded.revision == 2
    # --reuse-values kept the certificates: the APIService still trusts the replicas.
    service = run_sync(cluster.plane.api("GET", APISERVICE))
    available = [c for c in service["status"]["conditions"] if c["type"] == "Available"]
    assert available[0]["status"] == "True", available


def test_the_console_lives_through_the_upgrade(upgraded: Upgrade) -> None:
    seen = upgraded.outcome.seen
    assert seen.shell_kept_state, "the VM's shell is the one the writer had"
    assert upgraded.outcome.without_an_end == []
    assert seen.writer_wait.seconds <= RECOVER_S, seen.report()
    assert seen.forward_wait.seconds <= RECOVER_S, seen.report()


# A new image rolls the agents with the replicas (kustomize's `images:` does the same;
# test_vm_rollouts.py rolls them one after the other). In each of three runs here the
# writer's session was dialed through node-a's old agent as it stopped, and `subres
# console` exited on that 1011 ("the subres agent of node ... is shutting down") instead
# of reconnecting; run again, as a user would, it found the same shell.
@pytest.mark.xfail(
    reason="a stopping agent ends its relays with an ERROR frame, which the replica passes on "
    "as 1011 (the backend failed), not 1001: the CLI exits where it should reconnect "
    "(3 runs of 3; a kept console redials, a writer does not)",
    strict=True,
)
def test_the_writers_cli_reconnects_by_itself_through_the_upgrade(upgraded: Upgrade) -> None:
    assert upgraded.outcome.reconnected(), upgraded.outcome.seen.report()


def test_uninstall_removes_the_release_and_keeps_the_machines(
    cluster: Cluster, release: Release, upgraded: Upgrade
) -> None:
    run_sync(install.run_block(cluster, release.uninstall_script, release.workdir))
    cluster_wide = [
        APISERVICE,
        "/apis/rbac.authorization.k8s.io/v1/clusterroles/subres-machine-user",
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/subres:system:auth-delegator",
        "/apis/rbac.authorization.k8s.io/v1/namespaces/kube-system/rolebindings/"
        "subres:extension-apiserver-authentication-reader",
    ]
    run_sync(_wait_gone(cluster, *cluster_wide, *NAMESPACES))
    crd = run_sync(cluster.plane.api("GET", CRD))
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    machine = run_sync(
        cluster.plane.api("GET", f"/apis/subres.dev/v1alpha1/namespaces/{vm.NS}/machines/{vm.NAME}")
    )
    assert machine["metadata"]["name"] == vm.NAME


def _deployment(cluster: Cluster) -> dict[str, Any]:
    path = f"/apis/apps/v1/namespaces/{install.NAMESPACE}/deployments/subres"
    return dict(run_sync(cluster.plane.api("GET", path)))
