"""deploy/ installed as shipped, by the words of docs/operating.md, on a real two-node cluster.

What an operator's first hour needs to see: both replicas Ready on different
nodes with the PDB in force, an agent on every node, the APIService
Available and discovery through kube-apiserver, the replicas admitted at
Pod Security `restricted` in a namespace that enforces it, and a node drain
that can never take both replicas at once.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.cluster import install
from tests.cluster.cluster import Cluster
from tests.e2e.controlplane import APIError, run_sync

# The first test of the session pays for bringing the cluster up and installing subres.
pytestmark = pytest.mark.timeout(900)

REPLICAS = install.REPLICAS
AGENTS = install.AGENTS


def test_the_docs_block_is_what_runs(installed: install.Installed) -> None:
    assert "subres certs --out deploy/certs" in installed.script
    assert "kubectl apply -k deploy/site" in installed.script


def test_two_replicas_are_ready_on_different_nodes(
    cluster: Cluster, installed: install.Installed
) -> None:
    pods = run_sync(install.wait_pods(cluster, install.NAMESPACE, REPLICAS, count=2))
    assert {p["spec"]["nodeName"] for p in pods} == {"node-a", "node-b"}
    assert {p["spec"]["containers"][0]["image"] for p in pods} == {install.IMAGE}


def test_an_agent_runs_on_every_node(cluster: Cluster, installed: install.Installed) -> None:
    pods = run_sync(install.wait_pods(cluster, install.AGENT_NAMESPACE, AGENTS, count=2))
    assert sorted(p["spec"]["nodeName"] for p in pods) == ["node-a", "node-b"]


def test_the_apiservice_is_available_and_discovery_goes_through_kube_apiserver(
    cluster: Cluster, installed: install.Installed
) -> None:
    service = run_sync(
        cluster.plane.api(
            "GET", f"/apis/apiregistration.k8s.io/v1/apiservices/{install.APISERVICE}"
        )
    )
    available = [c for c in service["status"]["conditions"] if c["type"] == "Available"]
    assert available[0]["status"] == "True", available
    discovery = run_sync(
        cluster.plane.kubectl("get", "--raw", "/apis/subresources.subres.dev/v1alpha1")
    )
    resources = {r["name"] for r in discovery.check().json()["resources"]}
    assert {"machines/console", "machines/vnc", "machines/screenshot", "machines/portforward"} <= (
        resources
    )
    # kubectl reads the group's list without a complaint: one it cannot read makes the
    # command fail ("unable to retrieve the complete list of server APIs"), and check() raises.
    run_sync(cluster.plane.kubectl("api-resources", "--api-group=subresources.subres.dev")).check()


def test_the_replicas_namespace_enforces_restricted(
    cluster: Cluster, installed: install.Installed
) -> None:
    namespace = run_sync(cluster.plane.api("GET", f"/api/v1/namespaces/{install.NAMESPACE}"))
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    # The replicas run there, so they pass `restricted`; what does not pass is refused.
    template = _deployment(cluster)["spec"]["template"]
    hostpath = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "not-restricted", "namespace": install.NAMESPACE},
        "spec": {
            **template["spec"],
            "volumes": [
                *template["spec"]["volumes"],
                {"name": "host", "hostPath": {"path": "/run/subres/sockets"}},
            ],
        },
    }
    with pytest.raises(APIError) as refused:
        run_sync(
            cluster.plane.api(
                "POST",
                f"/api/v1/namespaces/{install.NAMESPACE}/pods",
                hostpath,
                params={"dryRun": "All"},
            )
        )
    assert refused.value.status == 403
    message = json.loads(refused.value.body)["message"]
    assert 'violates PodSecurity "restricted:latest"' in message
    assert 'restricted volume types (volume "host" uses restricted volume type "hostPath")' in (
        message
    )


def test_the_pdb_keeps_one_replica_through_a_drain(
    cluster: Cluster, installed: install.Installed
) -> None:
    pods = run_sync(install.wait_pods(cluster, install.NAMESPACE, REPLICAS, count=2))
    budget = run_sync(
        cluster.plane.api(
            "GET", f"/apis/policy/v1/namespaces/{install.NAMESPACE}/poddisruptionbudgets/subres"
        )
    )
    assert (budget["status"]["currentHealthy"], budget["status"]["disruptionsAllowed"]) == (2, 1)
    first, second = (p["metadata"]["name"] for p in pods)
    run_sync(_evict(cluster, first))
    with pytest.raises(APIError) as blocked:
        run_sync(_evict(cluster, second))
    assert blocked.value.status == 429
    assert "disruption budget" in blocked.value.body
    run_sync(install.wait_pods(cluster, install.NAMESPACE, REPLICAS, count=2))


def _deployment(cluster: Cluster) -> dict[str, Any]:
    path = f"/apis/apps/v1/namespaces/{install.NAMESPACE}/deployments/subres"
    return dict(run_sync(cluster.plane.api("GET", path)))


async def _evict(cluster: Cluster, pod: str) -> None:
    await cluster.plane.api(
        "POST",
        f"/api/v1/namespaces/{install.NAMESPACE}/pods/{pod}/eviction",
        {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": pod, "namespace": install.NAMESPACE},
        },
    )
