"""Failure drills on real pods while people use the VM: what they see, how long, what is lost.

Each drill starts the same users (a writer probing the VM's shell, an
observer, a port-forward fetching the guest's page), breaks one thing and
measures until both get answers again: the replica pod holding the console
is force-deleted; the agent pod of the VM's node is killed; kube-apiserver
restarts; the network between the replica holding the console and node-a's
agent is cut (nftables rules in the nodes' own namespaces, removed after).
The bound is issue 18's: a failover within 10 s, the VM's shell as it was,
every session's audit end line.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cluster import install, live, network, vm
from tests.cluster.cluster import Cluster

pytestmark = pytest.mark.timeout(900)

FAILOVER_S = 10.0
"""Issue 18: a console's new owner takes over within 10 s."""
DRILL_TABLE = "subres-drill"


async def pod_on(cluster: Cluster, namespace: str, selector: str, node: str) -> dict[str, str]:
    for pod in await install.pods(cluster, namespace, selector):
        if pod["spec"]["nodeName"] == node and "deletionTimestamp" not in pod["metadata"]:
            return {"name": pod["metadata"]["name"], "ip": pod["status"]["podIP"]}
    raise AssertionError(f"no {selector} pod on {node}")


async def pod_address(cluster: Cluster, namespace: str, name: str) -> str:
    pod = await cluster.plane.api("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
    return str(pod["status"]["podIP"])


def report(seen: live.Seen, users: live.Live) -> None:
    for line in [*seen.report(), f"  without an audit end: {users.logs.sessions_without_an_end()}"]:
        print(line)


def assert_failed_over(seen: live.Seen) -> None:
    assert seen.shell_kept_state, "the VM's shell is the one the writer had"
    assert seen.writer_wait.seconds <= FAILOVER_S, seen.report()
    assert seen.forward_wait.seconds <= FAILOVER_S, seen.report()


async def test_force_deleting_the_replica_that_holds_the_console(
    cluster: Cluster, running_vm: vm.Vm, tmp_path: Path
) -> None:
    async with live.live_users(cluster, tmp_path) as users:
        holder = await live.lease_holder(cluster, "console")
        assert holder, "a console Lease names the replica holding the writer"
        address = await pod_address(cluster, install.NAMESPACE, holder)

        async def force_delete() -> None:
            deleted = await cluster.plane.kubectl(
                "delete", "pod", holder, "-n", install.NAMESPACE, "--grace-period=0", "--force"
            )
            deleted.check()
            # The API forgets the pod at once; its node kills it a moment later.
            await install.wait_gone(cluster, address, 8443)

        seen = await live.through(users, f"force-deleting replica {holder}", force_delete)
    report(seen, users)
    await install.wait_pods(cluster, install.NAMESPACE, install.REPLICAS, count=2)
    assert any("Reconnected" in line for line in seen.writer_said), seen.writer_said
    assert_failed_over(seen)


async def test_killing_the_agent_of_the_vms_node(
    cluster: Cluster, running_vm: vm.Vm, tmp_path: Path
) -> None:
    agent = await pod_on(cluster, install.AGENT_NAMESPACE, install.AGENTS, vm.NODE)
    async with live.live_users(cluster, tmp_path) as users:

        async def kill_agent() -> None:
            killed = await cluster.plane.kubectl(
                "delete", "pod", agent["name"], "-n", install.AGENT_NAMESPACE,
                "--grace-period=0", "--force",
            )  # fmt: skip
            killed.check()
            await install.wait_gone(cluster, agent["ip"], 8444)

        seen = await live.through(users, f"killing agent {agent['name']} on node-a", kill_agent)
    report(seen, users)
    await install.wait_pods(cluster, install.AGENT_NAMESPACE, install.AGENTS, count=2)
    assert_failed_over(seen)


@pytest.mark.xfail(
    reason="today: right after kube-apiserver is back, the reconnecting CLI is answered 403 "
    "for a user who may (the replica caches denials for 10 s) and gives up; ~45 s for a run "
    "that answers (see the printed figures)",
    strict=False,
)
async def test_restarting_kube_apiserver(
    cluster: Cluster, running_vm: vm.Vm, tmp_path: Path
) -> None:
    async with live.live_users(cluster, tmp_path) as users:
        seen = await live.through(users, "restarting kube-apiserver", cluster.restart_apiserver)
    report(seen, users)
    assert any("Reconnected" in line for line in seen.writer_said), seen.writer_said
    assert_failed_over(seen)
    assert users.logs.sessions_without_an_end() == []


@pytest.mark.xfail(
    reason="today: nothing notices a silent agent relay; the console freezes with no "
    "message for as long as the cut lasts (30 s here, then mended), the observer too; "
    "issue 18's peer relays may route around it",
    strict=False,
)
async def test_cutting_the_network_between_a_replica_and_the_agent(
    cluster: Cluster, running_vm: vm.Vm, tmp_path: Path
) -> None:
    agent = await pod_on(cluster, install.AGENT_NAMESPACE, install.AGENTS, vm.NODE)
    async with live.live_users(cluster, tmp_path) as users:
        holder = await live.lease_holder(cluster, "console")
        assert holder, "a console Lease names the replica holding the writer"
        replicas = await install.pods(cluster, install.NAMESPACE, install.REPLICAS)
        [replica_ip] = [p["status"]["podIP"] for p in replicas if p["metadata"]["name"] == holder]

        async def cut() -> None:
            for node in cluster.nodes:
                network.cut(node.net.netns, DRILL_TABLE, replica_ip, agent["ip"])

        try:
            # Three times the failover bound is enough to tell a freeze from a failover.
            seen = await live.through(
                users,
                f"cutting {holder} ({replica_ip}) off agent {agent['ip']}",
                cut,
                settle_s=3 * FAILOVER_S,
            )
        finally:
            for node in cluster.nodes:
                network.mend(node.net.netns, DRILL_TABLE)
    report(seen, users)
    assert_failed_over(seen)
