"""Where each node's agent is, learned from the agent pods (a list+watch sink).

The replicas never hold a static list: the informer over the agent pods (the
DaemonSet's, selected by label in subres's namespace) keeps this directory
current. A pod counts once it is scheduled to a node, has an address, is
Ready and is not being deleted; when a node briefly has two (a rolling
update), the newest ready one wins. Whoever follows the directory (the
console keeper) is told when the agent of some node changes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["AgentPods"]

Key = tuple[str, str]


class AgentPods:
    """node name → `https://podIP:port` of its agent, fed by a pod informer."""

    def __init__(self, port_name: str) -> None:
        self.port_name = port_name
        self._pods: dict[Key, Mapping[str, Any]] = {}
        self._nodes: dict[str, str] = {}
        self.synced = False
        self._followers: list[Callable[[], None]] = []

    def url(self, node: str) -> str | None:
        """The agent of `node`, or None when no ready agent pod runs there."""
        return self._nodes.get(node)

    def follow(self, changed: Callable[[], None]) -> None:
        """Call `changed` (which must not block) whenever the agent of some node changes."""
        self._followers.append(changed)

    def replace(self, objects: Iterable[Mapping[str, Any]]) -> None:
        """A complete listing of the agent pods."""
        self._pods = {_key(pod): pod for pod in objects}
        self.synced = True
        self._index()

    def upsert(self, obj: Mapping[str, Any]) -> None:
        """A pod was added or changed."""
        self._pods[_key(obj)] = obj
        self._index()

    def delete(self, obj: Mapping[str, Any]) -> None:
        """A pod was deleted."""
        self._pods.pop(_key(obj), None)
        self._index()

    def _index(self) -> None:
        # A few pods per node at most: rebuilding on each event is simpler than patching.
        best: dict[str, tuple[str, str]] = {}
        for pod in self._pods.values():
            found = self._serving(pod)
            if found is None:
                continue
            node, url = found
            created = str(pod.get("metadata", {}).get("creationTimestamp") or "")
            if node not in best or created > best[node][0]:
                best[node] = (created, url)
        nodes = {node: url for node, (_, url) in best.items()}
        changed = nodes != self._nodes
        self._nodes = nodes
        if changed:
            for follower in self._followers:
                follower()

    def _serving(self, pod: Mapping[str, Any]) -> tuple[str, str] | None:
        """(node, URL) of a pod that can take relays now, else None."""
        meta, spec, status = (pod.get(k) or {} for k in ("metadata", "spec", "status"))
        node, ip = spec.get("nodeName"), status.get("podIP")
        if meta.get("deletionTimestamp") or not node or not ip or not _ready(status):
            return None
        port = self._port(spec)
        if port is None:
            return None
        host = f"[{ip}]" if ":" in str(ip) else str(ip)
        return str(node), f"https://{host}:{port}"

    def _port(self, spec: Mapping[str, Any]) -> int | None:
        for container in spec.get("containers") or ():
            for port in container.get("ports") or ():
                if port.get("name") == self.port_name and isinstance(
                    port.get("containerPort"), int
                ):
                    return int(port["containerPort"])
        return None


def _ready(status: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or ()
    )


def _key(obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
