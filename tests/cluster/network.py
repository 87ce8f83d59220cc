"""The real cluster's network: a bridge on the host, one network namespace per node.

::

    host:  subres-br0 10.200.0.1/24  (kube-apiserver listens here)
             ├─ veth ── netns subres-node-a: eth0 10.200.0.2, cni0 10.244.0.1/24 (its pods)
             └─ veth ── netns subres-node-b: eth0 10.200.0.3, cni0 10.244.1.1/24

Each node's kubelet, kube-proxy and containerd run in the node's namespace,
so what they do to netfilter and to ``net.*`` sysctls stays there; the host
gets only the bridge and the routes to the pod subnets (which go with it).
Nothing is routed off the bridge: the namespaces have no default route.
Commands enter a namespace with ``nsenter --net`` only, so that a node's
programs share the host's mounts (the kubelet's volumes must be visible to
containerd).
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "BRIDGE",
    "GATEWAY",
    "POD_CIDR",
    "SERVICE_CIDR",
    "NetworkError",
    "NodeNet",
    "create_bridge",
    "create_node",
    "cut",
    "in_netns",
    "mend",
    "node_nets",
    "run",
]

BRIDGE = "subres-br0"
GATEWAY = "10.200.0.1"
"""The host's address on the bridge: kube-apiserver binds to it and advertises it."""
PREFIX = 24
POD_CIDR = "10.244.0.0/16"
SERVICE_CIDR = "10.0.0.0/24"
"""kube-apiserver's ``--service-cluster-ip-range`` (its certificate names 10.0.0.1)."""


class NetworkError(RuntimeError):
    """A network command failed; carries its output."""


@dataclass(frozen=True)
class NodeNet:
    """One node's place on the network."""

    name: str
    """The node's name, e.g. ``node-a``."""
    index: int

    @property
    def netns(self) -> str:
        return f"subres-{self.name}"

    @property
    def address(self) -> str:
        """The node IP (eth0 in its namespace)."""
        return f"10.200.0.{2 + self.index}"

    @property
    def pod_subnet(self) -> str:
        return f"10.244.{self.index}.0/24"

    @property
    def host_veth(self) -> str:
        return f"sr-{self.name}"[:15]


def node_nets(names: Sequence[str]) -> list[NodeNet]:
    return [NodeNet(name, index) for index, name in enumerate(names)]


def run(
    args: Sequence[str], *, netns: str | None = None, check: bool = True, stdin: str | None = None
) -> str:
    """Run a command (in a node's network namespace); its output, or NetworkError."""
    proc = subprocess.run(
        in_netns(netns, args) if netns else list(args),
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
    )
    if check and proc.returncode != 0:
        raise NetworkError(f"{' '.join(args)}: {proc.stdout}{proc.stderr}")
    return proc.stdout


def in_netns(netns: str, args: Sequence[str]) -> list[str]:
    """`args` run in the network namespace `netns` and nothing else of its own."""
    return ["nsenter", f"--net=/run/netns/{netns}", "--", *args]


def create_bridge() -> None:
    run(["ip", "link", "add", BRIDGE, "type", "bridge"])
    run(["ip", "addr", "add", f"{GATEWAY}/{PREFIX}", "dev", BRIDGE])
    run(["ip", "link", "set", BRIDGE, "up"])


def create_node(node: NodeNet, others: Sequence[NodeNet]) -> None:
    """The node's namespace, its veth on the bridge, forwarding and routes to every pod subnet."""
    run(["ip", "netns", "add", node.netns])
    run(
        [
            "ip",
            "link",
            "add",
            node.host_veth,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            node.netns,
        ]
    )
    run(["ip", "link", "set", node.host_veth, "master", BRIDGE, "up"])
    ns = node.netns
    run(["ip", "addr", "add", f"{node.address}/{PREFIX}", "dev", "eth0"], netns=ns)
    run(["ip", "link", "set", "eth0", "up"], netns=ns)
    run(["ip", "link", "set", "lo", "up"], netns=ns)
    # Service addresses are DNATed and routed by the node: it forwards (in its namespace only).
    run(["sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"], netns=ns)
    for other in others:
        if other != node:
            run(["ip", "route", "add", other.pod_subnet, "via", other.address], netns=ns)
    run(["ip", "route", "add", node.pod_subnet, "via", node.address, "dev", BRIDGE])


def cut(netns: str, table: str, a: str, b: str) -> None:
    """Drop every packet between addresses `a` and `b` that passes the namespace `netns`.

    Routed packets meet the ``inet`` forward hook; packets between two pods of one
    node cross its bridge and meet the ``bridge`` forward hook. ``mend`` undoes it.
    """
    for family in ("inet", "bridge"):
        rules = [
            f"add table {family} {table}",
            f"add chain {family} {table} forward {{ type filter hook forward priority -10 ; }}",
            f"add rule {family} {table} forward ip saddr {a} ip daddr {b} drop",
            f"add rule {family} {table} forward ip saddr {b} ip daddr {a} drop",
        ]
        run(["nft", "-f", "-"], netns=netns, stdin="\n".join(rules) + "\n")


def mend(netns: str, table: str) -> None:
    """Remove what ``cut`` added to `netns` (nothing if it added nothing)."""
    for family in ("inet", "bridge"):
        run(["nft", "delete", "table", family, table], netns=netns, check=False)
