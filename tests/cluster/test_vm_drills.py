"""Failure drills on real pods while people use the VM: what they see, how long, what is lost.

Each drill (a module fixture) starts the same users (a writer probing the VM's
shell, an observer, a port-forward fetching the guest's page), breaks one
thing and measures until both get answers again, printing what they saw: the
replica pod holding the console is force-deleted; the agent pod of the VM's
node is killed; kube-apiserver restarts; the network between the replica
holding the console and node-a's agent is cut (nftables rules in the nodes'
own namespaces, removed after). Each expectation is one test, the bound
issue 18's: a failover within 10 s, nothing lost (the VM's shell as it was,
every session's audit end line). What misses it today is marked, with why.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from tests.cluster import install, live, network, users, vm
from tests.cluster.cluster import Cluster
from tests.e2e.controlplane import poll, run_sync

pytestmark = pytest.mark.timeout(900)

FAILOVER_S = 10.0
"""Issue 18: a console's new owner takes over within 10 s."""
DRILL_TABLE = "subres-drill"


async def pod_on(cluster: Cluster, namespace: str, selector: str, node: str) -> dict[str, str]:
    for pod in await install.pods(cluster, namespace, selector):
        if pod["spec"]["nodeName"] == node and "deletionTimestamp" not in pod["metadata"]:
            return {"name": pod["metadata"]["name"], "ip": pod["status"]["podIP"]}
    raise AssertionError(f"no {selector} pod on {node}")


async def console_holder(cluster: Cluster) -> dict[str, str]:
    """The replica pod that owns the writer's console."""
    holder = await live.console_owner(cluster)
    for pod in await install.pods(cluster, install.NAMESPACE, install.REPLICAS):
        if pod["metadata"]["name"] == holder:
            return {"name": holder, "ip": pod["status"]["podIP"]}
    raise AssertionError(f"no live replica owns the console ({holder!r})")


def drill(
    cluster: Cluster,
    home: Path,
    what: str,
    change: Callable[[], Awaitable[None]],
    *,
    settle_s: float = live.SETTLE_TIMEOUT_S,
) -> live.Outcome:
    return run_sync(live.observe(cluster, home, what, change, settle_s=settle_s))


# -- the replica holding the console, force-deleted ------------------------------------


@pytest.fixture(scope="module")
def replica_deleted(
    cluster: Cluster, running_vm: vm.Vm, tmp_path_factory: pytest.TempPathFactory
) -> live.Outcome:
    holder: dict[str, str] = {}

    async def force_delete() -> None:
        holder.update(await console_holder(cluster))
        deleted = await cluster.plane.kubectl(
            "delete", "pod", holder["name"], "-n", install.NAMESPACE, "--grace-period=0", "--force"
        )
        deleted.check()
        # The API forgets the pod at once; its node kills it a moment later.
        await install.wait_gone(cluster, holder["ip"], 8443)

    home = tmp_path_factory.mktemp("replica")
    outcome = drill(cluster, home, "force-deleting the replica holding the console", force_delete)
    run_sync(install.wait_pods(cluster, install.NAMESPACE, install.REPLICAS, count=2))
    return outcome


def test_a_deleted_replicas_users_reconnect_by_themselves(replica_deleted: live.Outcome) -> None:
    assert replica_deleted.reconnected(), replica_deleted.seen.report()
    assert replica_deleted.seen.shell_kept_state


def test_a_deleted_replicas_console_fails_over_within_10_s(replica_deleted: live.Outcome) -> None:
    assert replica_deleted.seen.writer_wait.seconds <= FAILOVER_S
    assert replica_deleted.seen.forward_wait.seconds <= FAILOVER_S


@pytest.mark.xfail(
    reason="a killed replica writes no end line for the sessions it fronted (those it only "
    "owned are ended by their fronts): passes when kube-apiserver sent the users elsewhere",
    strict=False,
)
def test_a_deleted_replicas_sessions_keep_their_audit_end_lines(
    replica_deleted: live.Outcome,
) -> None:
    assert replica_deleted.without_an_end == []


# -- the agent of the VM's node, killed ------------------------------------------------


@pytest.fixture(scope="module")
def agent_killed(
    cluster: Cluster,
    running_vm: vm.Vm,
    tmp_path_factory: pytest.TempPathFactory,
) -> live.Outcome:
    async def kill_agent() -> None:
        agent = await pod_on(cluster, install.AGENT_NAMESPACE, install.AGENTS, vm.NODE)
        killed = await cluster.plane.kubectl(
            "delete", "pod", agent["name"], "-n", install.AGENT_NAMESPACE,
            "--grace-period=0", "--force",
        )  # fmt: skip
        killed.check()
        await install.wait_gone(cluster, agent["ip"], 8444)

    home = tmp_path_factory.mktemp("agent")
    outcome = drill(cluster, home, "killing the agent of node-a", kill_agent)
    run_sync(install.wait_pods(cluster, install.AGENT_NAMESPACE, install.AGENTS, count=2))
    return outcome


def test_a_killed_agents_users_are_told_and_a_new_run_answers_within_10_s(
    agent_killed: live.Outcome,
) -> None:
    seen = agent_killed.seen
    assert any('subres agent of node "node-a"' in line for line in seen.exits), seen.exits
    assert seen.writer_wait.seconds <= FAILOVER_S
    assert seen.shell_kept_state
    assert agent_killed.without_an_end == []


# -- kube-apiserver, restarted ---------------------------------------------------------


@pytest.fixture(scope="module")
def apiserver_restarted(
    cluster: Cluster,
    running_vm: vm.Vm,
    tmp_path_factory: pytest.TempPathFactory,
) -> live.Outcome:
    home = tmp_path_factory.mktemp("apiserver")
    return drill(cluster, home, "restarting kube-apiserver", cluster.restart_apiserver)


def test_a_kube_apiserver_restart_loses_nothing_in_the_vm(
    apiserver_restarted: live.Outcome,
) -> None:
    assert apiserver_restarted.seen.shell_kept_state


@pytest.mark.xfail(
    reason="today: right after kube-apiserver is back (ready), the reconnecting CLIs are "
    "answered 403 for a user who may (a replica caches denials for 10 s) and give up; "
    "15 to 45 s before a new run answers",
    strict=False,
)
def test_after_a_kube_apiserver_restart_the_clis_reconnect_within_10_s(
    apiserver_restarted: live.Outcome,
) -> None:
    assert apiserver_restarted.reconnected(), apiserver_restarted.seen.exits
    assert apiserver_restarted.seen.writer_wait.seconds <= FAILOVER_S


@pytest.mark.xfail(
    reason="today: the sessions kube-apiserver carried when it stopped have no end line "
    "15 s after their users left",
    strict=False,
)
def test_a_kube_apiserver_restart_keeps_every_audit_end_line(
    apiserver_restarted: live.Outcome,
) -> None:
    assert apiserver_restarted.without_an_end == []


# -- a replica cut off the agent -------------------------------------------------------


@pytest.fixture(scope="module")
def replica_cut_off(
    cluster: Cluster,
    running_vm: vm.Vm,
    tmp_path_factory: pytest.TempPathFactory,
) -> live.Outcome:
    async def cut() -> None:
        agent = await pod_on(cluster, install.AGENT_NAMESPACE, install.AGENTS, vm.NODE)
        replica = await console_holder(cluster)
        print(f"  cutting {replica['name']} ({replica['ip']}) off the agent at {agent['ip']}")
        for node in cluster.nodes:
            network.cut(node.net.netns, DRILL_TABLE, replica["ip"], agent["ip"])

    home = tmp_path_factory.mktemp("cut")
    try:
        # Three times the failover bound tells a freeze from a failover.
        return drill(cluster, home, "a replica cut off the agent", cut, settle_s=3 * FAILOVER_S)
    finally:
        for node in cluster.nodes:
            network.mend(node.net.netns, DRILL_TABLE)
        run_sync(_recover(cluster, home))


async def _recover(cluster: Cluster, home: Path) -> None:
    """After the cut: how long until a new console answers; restart the agent if none does.

    The frozen relay may still hold the VM's serial port (QEMU serves one connection
    at a time) until TCP gives up on it; the later tests need the port back.
    """
    started = time.monotonic()
    if await _console_answers(cluster, home, within_s=60.0):
        print(f"  after mending, a new console answered in {time.monotonic() - started:.1f} s")
        return
    print("  after mending, no new console answered within 60 s: restarting node-a's agent")
    agent = await pod_on(cluster, install.AGENT_NAMESPACE, install.AGENTS, vm.NODE)
    (
        await cluster.plane.kubectl(
            "delete", "pod", agent["name"], "-n", install.AGENT_NAMESPACE, "--wait=true"
        )
    ).check()
    await install.wait_pods(cluster, install.AGENT_NAMESPACE, install.AGENTS, count=2)
    assert await _console_answers(cluster, home, within_s=60.0), "the VM's console came back"


async def _console_answers(cluster: Cluster, home: Path, *, within_s: float) -> bool:
    args = ["console", vm.NAME, "-n", vm.NS, "--timeout", "1m"]
    async with contextlib.AsyncExitStack() as stack:
        ready = re.compile(rb"Connected to")
        writer = users.ConsoleWriter(users.Rerun(args, live.cli_env(cluster, home), stack, ready))
        return await poll(writer.probe, timeout_s=within_s)


@pytest.mark.xfail(
    reason="today: nothing notices a silent agent relay; the console freezes for as long "
    "as the cut lasts (30 s here, then mended), the observer too, and after the mend the "
    "stale relay still holds the VM's one serial connection until the agent restarts",
    strict=False,
)
def test_a_replica_cut_off_the_agent_fails_over_within_10_s(
    replica_cut_off: live.Outcome,
) -> None:
    assert replica_cut_off.seen.writer_wait.seconds <= FAILOVER_S
    assert replica_cut_off.seen.shell_kept_state


def test_a_replica_cut_off_the_agent_keeps_the_port_forward(
    replica_cut_off: live.Outcome,
) -> None:
    # The port-forward dials the VM pod's address directly, not through the agent.
    assert replica_cut_off.seen.forward_wait.seconds <= FAILOVER_S
