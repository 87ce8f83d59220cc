"""The agent directory a replica keeps from the agent pods it watches."""

from __future__ import annotations

from typing import Any

from subres.kube.agents import AgentPods


def pod(
    name: str,
    node: str,
    ip: str | None,
    *,
    ready: bool = True,
    created: str = "2026-01-01T00:00:00Z",
    deleting: bool = False,
    port: int = 8444,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "subres-system",
        "creationTimestamp": created,
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-01-02T00:00:00Z"
    status: dict[str, Any] = {
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]
    }
    if ip is not None:
        status["podIP"] = ip
    return {
        "metadata": meta,
        "spec": {
            "nodeName": node,
            "containers": [{"name": "agent", "ports": [{"name": "relay", "containerPort": port}]}],
        },
        "status": status,
    }


def test_only_ready_scheduled_addressed_pods_serve_their_node() -> None:
    agents = AgentPods("relay")
    agents.replace(
        [
            pod("a", "node-a", "10.0.0.1"),
            pod("b", "node-b", "10.0.0.2", ready=False),
            pod("c", "node-c", None),
            pod("d", "node-d", "10.0.0.4", deleting=True),
            pod("e", "node-e", "fd00::5", port=9000),
        ]
    )
    assert agents.synced
    assert agents.url("node-a") == "https://10.0.0.1:8444"
    assert agents.url("node-b") is agents.url("node-c") is agents.url("node-d") is None
    assert agents.url("node-e") == "https://[fd00::5]:9000"
    assert agents.url("node-z") is None


def test_watch_events_move_a_node_to_its_newest_ready_agent() -> None:
    agents = AgentPods("relay")
    agents.replace([pod("old", "node-a", "10.0.0.1")])
    agents.upsert(pod("new", "node-a", "10.0.0.9", created="2026-03-01T00:00:00Z", ready=False))
    assert agents.url("node-a") == "https://10.0.0.1:8444"
    agents.upsert(pod("new", "node-a", "10.0.0.9", created="2026-03-01T00:00:00Z"))
    assert agents.url("node-a") == "https://10.0.0.9:8444"
    agents.delete(pod("new", "node-a", "10.0.0.9"))
    assert agents.url("node-a") == "https://10.0.0.1:8444"
    agents.delete(pod("old", "node-a", "10.0.0.1"))
    assert agents.url("node-a") is None


def test_followers_hear_of_a_node_changing_agents_and_of_nothing_else() -> None:
    agents = AgentPods("relay")
    heard: list[str | None] = []
    agents.follow(lambda: heard.append(agents.url("node-a")))
    agents.replace([pod("old", "node-a", "10.0.0.1")])
    # A new pod that is not Ready yet, and a status update that changes nothing served.
    agents.upsert(pod("new", "node-a", "10.0.0.2", ready=False, created="2026-01-01T00:01:00Z"))
    agents.upsert(pod("old", "node-a", "10.0.0.1"))
    agents.upsert(pod("new", "node-a", "10.0.0.2", created="2026-01-01T00:01:00Z"))
    agents.delete(pod("old", "node-a", "10.0.0.1"))
    agents.delete(pod("new", "node-a", "10.0.0.2"))
    assert heard == ["https://10.0.0.1:8444", "https://10.0.0.2:8444", None]
