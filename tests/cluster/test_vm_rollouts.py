"""Rolling the Deployment to another image, and the agents, while people use the VM.

The VM's console is kept and recorded (the recordings component, on a
ReadWriteMany volume every replica shares). A writer types into it, an
observer watches, a port-forward fetches the guest's web page, and every
replica's log is followed. Then the Deployment rolls to another image, and
then the agent DaemonSet restarts. What the issue asks: the CLIs reconnect by
themselves, the kept console goes on from a new pod, the recording marks the
gap, every session has its audit end line, and a failover takes at most 10 s
(issue 18's bound; what today's replicas do is measured and printed).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster import install, live, vm
from tests.cluster.cluster import Cluster
from tests.e2e.controlplane import poll, run_sync

pytestmark = pytest.mark.timeout(900)

FAILOVER_S = 10.0
"""Issue 18: a console's new owner takes over within 10 s."""
KEEP = "subres.dev/keep-console"
RECORD = "subres.dev/record-console"


@pytest.fixture(scope="module")
def kept_and_recorded(
    cluster: Cluster, installed: install.Installed, running_vm: vm.Vm
) -> Iterator[None]:
    """deploy/components/recordings on a shared volume, and vm1's console kept and recorded."""
    run_sync(_add_recordings(cluster, installed.workdir))
    run_sync(_annotate(cluster, {KEEP: "true", RECORD: "true"}))
    yield
    run_sync(_annotate(cluster, {KEEP: None, RECORD: None}))


async def _add_recordings(cluster: Cluster, workdir: Path) -> None:
    """An overlay of the install with the recordings component, and a volume for its claim.

    No provisioner runs here: a hostPath PersistentVolume (every node is this
    host, so it is shared as ReadWriteMany is) answers the claim.
    """
    shared = cluster.workdir / "recordings"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)  # the replicas write as 65532
    overlay = workdir / "deploy" / "recorded"
    overlay.mkdir()
    volume = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": "subres-recordings"},
        "spec": {
            "capacity": {"storage": "10Gi"},
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "",
            "hostPath": {"path": str(shared)},
        },
    }
    (overlay / "volume.yaml").write_text(yaml.safe_dump(volume))
    kustomization = {
        "resources": ["../site", "volume.yaml"],
        "components": ["../components/recordings"],
    }
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    (await cluster.plane.kubectl("apply", "-k", str(overlay))).check()
    await install.rollout(cluster, "deployment", "subres", install.NAMESPACE)


async def _annotate(cluster: Cluster, annotations: dict[str, str | None]) -> None:
    patch = {"metadata": {"annotations": annotations}}
    (
        await cluster.plane.kubectl(
            "patch", "machine", vm.NAME, "-n", vm.NS, "--type=merge", "-p", json.dumps(patch)
        )
    ).check()


async def recordings(cluster: Cluster) -> list[list[Any]]:
    """Every recording of vm1, oldest first, as asciicast events (the header left out)."""
    shared = cluster.workdir / "recordings" / vm.NS / vm.NAME
    files = sorted(shared.glob("*.cast"), key=lambda p: p.stat().st_mtime)
    return [[json.loads(line) for line in f.read_text().splitlines()[1:]] for f in files]


async def test_a_rolling_upgrade_keeps_every_session_going(
    cluster: Cluster, kept_and_recorded: None, tmp_path: Path
) -> None:
    async def kept() -> bool:
        return bool(await live.lease_holder(cluster, "console-keeper"))

    assert await poll(kept, timeout_s=60), "a replica keeps vm1's console"
    before = await live.lease_holder(cluster, "console-keeper")
    async with live.live_users(cluster, tmp_path) as users:

        async def upgrade() -> None:
            image = f"{install.IMAGE.rsplit(':', 1)[0]}:{install.NEXT_TAG}"
            (
                await cluster.plane.kubectl(
                    "set", "image", "deployment/subres", f"subres={image}", "-n", install.NAMESPACE
                )
            ).check()
            await install.rollout(cluster, "deployment", "subres", install.NAMESPACE)
            # Rolled out means the new pods are Ready; the old ones drain for 25 s more.
            await install.wait_pods(cluster, install.NAMESPACE, install.REPLICAS, count=2)

        seen = await live.through(users, "rolling upgrade of the Deployment", upgrade)
        after = await live.lease_holder(cluster, "console-keeper")
        cast = await recordings(cluster)
    endless = users.logs.sessions_without_an_end()
    for line in [
        *seen.report(),
        f"  keeper before {before!r}, after {after!r}; recordings: {len(cast)} files",
        f"  sessions without an audit end line: {endless}",
    ]:
        print(line)
    pods = await install.pods(cluster, install.NAMESPACE, install.REPLICAS)
    assert after in {p["metadata"]["name"] for p in pods}, "the kept console goes on from a new pod"
    assert before not in {p["metadata"]["name"] for p in pods}
    assert any("Reconnected" in line for line in seen.writer_said), seen.writer_said
    assert any("Reconnected" in line for line in seen.observer_said), seen.observer_said
    assert seen.shell_kept_state, "the VM's shell is the one the writer had"
    assert endless == [], "every session that ended has its audit end line"
    markers = [e[2] for events in cast for e in events if e[1] == "m"]
    assert any("left" in m for m in markers) and any("attached" in m for m in markers), markers
    assert seen.writer_wait.seconds <= FAILOVER_S, seen.report()
    assert seen.forward_wait.seconds <= FAILOVER_S, seen.report()


@pytest.mark.xfail(
    reason="today: the kept console ends for everyone attached when the agent goes (the "
    "writer's CLI exits 0, saying nothing), and the keeper dials again with a backoff: "
    "~20 s before a new run answers (see the printed figures)",
    strict=False,
)
async def test_rolling_the_agents_shows_users_a_bounded_gap(
    cluster: Cluster, kept_and_recorded: None, tmp_path: Path
) -> None:
    async with live.live_users(cluster, tmp_path) as users:

        async def restart_agents() -> None:
            (
                await cluster.plane.kubectl(
                    "rollout", "restart", "daemonset/subres-agent", "-n", install.AGENT_NAMESPACE
                )
            ).check()
            await install.rollout(cluster, "daemonset", "subres-agent", install.AGENT_NAMESPACE)
            await install.wait_pods(cluster, install.AGENT_NAMESPACE, install.AGENTS, count=2)

        seen = await live.through(users, "rolling the agent DaemonSet", restart_agents)
    for line in seen.report():
        print(line)
    assert seen.shell_kept_state
    assert seen.writer_wait.seconds <= FAILOVER_S, seen.report()
