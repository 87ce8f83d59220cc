"""`subres agent` flags: parsing and validation, no I/O.

The agent's policy is its own: which socket directories it dials into, and
which networks (none by default) it may dial over TCP or UDP. Nothing a
replica sends can widen it.
"""

from __future__ import annotations

import argparse
import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from subres.serving import connections, loops
from subres.serving.certs import REPLICA_IDENTITY

__all__ = ["AgentOptions", "add_arguments"]

DEFAULT_PORT = 8444
DEFAULT_ALLOWED_NAMES = (REPLICA_IDENTITY,)


@dataclass(frozen=True)
class AgentOptions:
    """What the command line said."""

    node_name: str
    """The node this agent serves (named in its refusals and logs)."""
    bind_address: str
    port: int
    tls_cert_file: Path
    """Serving certificate; replicas check it names their `--agent-server-name`."""
    tls_private_key_file: Path
    client_ca_file: Path
    """Only client certificates from this CA are accepted."""
    allowed_names: tuple[str, ...]
    """Common names of the replicas' client certificates that may relay."""
    socket_dirs: tuple[Path, ...]
    """unix sockets must lie under one of these, reached without following a link."""
    allow_tcp: tuple[str, ...]
    """Networks the agent may dial over TCP or UDP; empty turns both off."""
    connect_timeout: float
    read_size: int
    write_timeout: float = 30.0
    """Seconds a backend may take no data before its relay fails."""
    loop: str = loops.DEFAULT
    """The event loop: uvloop or asyncio (`subres.serving.loops`)."""
    connections: connections.Limits = field(default_factory=connections.Limits)
    """Handshake, header and idle timeouts and the unauthenticated cap, as `subres serve`'s."""
    socket_owners: Mapping[Path, tuple[int, int | None]] = field(default_factory=dict)
    """Per socket directory, the uid (and gid) its sockets and their listeners must have;
    a directory not named here: the uid that owns it."""

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> AgentOptions:
        """Options from parsed arguments (one field per flag, as `subres serve`'s)."""
        return cls(
            node_name=ns.node_name,
            bind_address=ns.bind_address,
            port=ns.port,
            tls_cert_file=ns.tls_cert_file,
            tls_private_key_file=ns.tls_private_key_file,
            client_ca_file=ns.client_ca_file,
            allowed_names=tuple(n for n in ns.allowed_names.split(",") if n),
            socket_dirs=tuple(Path(d.partition("=")[0]) for d in ns.socket_dir or ()),
            socket_owners=_owners(ns.socket_dir or ()),
            allow_tcp=tuple(ns.allow_tcp or ()),
            connect_timeout=ns.connect_timeout,
            read_size=ns.read_size,
            write_timeout=ns.write_timeout,
            loop=ns.loop,
            connections=connections.Limits.from_args(ns),
        )

    def validate(self) -> list[str]:
        """Every problem with these options; empty when they are usable."""
        problems = []
        if not self.node_name:
            problems.append("--node-name is required (in a DaemonSet: the pod's spec.nodeName)")
        if not 0 <= self.port <= 65535:
            problems.append(f"--port {self.port} is not a port")
        if not self.allowed_names:
            problems.append("--allowed-names must name at least one replica identity")
        if not self.socket_dirs and not self.allow_tcp:
            problems.append("give --socket-dir or --allow-tcp: this agent could dial nothing")
        problems += self._socket_problems()
        problems += self.connections.problems()
        for cidr in self.allow_tcp:
            try:
                ipaddress.ip_network(cidr)
            except ValueError as exc:
                problems.append(f"--allow-tcp {cidr}: {exc}")
        if self.connect_timeout <= 0:
            problems.append("--connect-timeout must be positive")
        if self.read_size <= 0:
            problems.append("--read-size must be positive")
        if self.write_timeout <= 0:
            problems.append("--write-timeout must be positive")
        return problems

    def _socket_problems(self) -> list[str]:
        problems = []
        for directory in self.socket_dirs:
            if not directory.is_absolute() or directory == Path("/"):
                problems.append(f"--socket-dir {directory} must be an absolute directory below /")
        for directory, (uid, gid) in self.socket_owners.items():
            if uid < 0 or (gid is not None and gid < 0):
                problems.append(f"--socket-dir {directory}: the owner must be UID[:GID]")
        return problems


def _owners(values: Iterable[str]) -> dict[Path, tuple[int, int | None]]:
    """`DIR=UID[:GID]` values as owners; a part that is not a number reads as -1 (invalid)."""
    owners: dict[Path, tuple[int, int | None]] = {}
    for value in values:
        directory, sep, owner = value.partition("=")
        if sep:
            uid, colon, gid = owner.partition(":")
            owners[Path(directory)] = (_id(uid), _id(gid) if colon else None)
    return owners


def _id(text: str) -> int:
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 10 else -1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `agent` flags."""
    add = parser.add_argument
    add("--node-name", default="", help="the node this agent runs on")
    add("--bind-address", default="0.0.0.0", help="address to listen on")
    add("--port", type=int, default=DEFAULT_PORT, help="HTTPS port (0 picks a free one)")
    add("--tls-cert-file", type=Path, required=True, help="serving certificate (PEM)")
    add("--tls-private-key-file", type=Path, required=True, help="serving key (PEM)")
    add("--client-ca-file", type=Path, required=True, help="CA of the replicas' certificates")
    add(
        "--allowed-names",
        default=",".join(DEFAULT_ALLOWED_NAMES),
        help="comma-separated client certificate common names allowed to relay",
    )
    add(
        "--socket-dir",
        action="append",
        metavar="DIR[=UID[:GID]]",
        help="directory whose unix sockets may be dialed, reached without following links, "
        "and the owner they and their listeners must have (default: DIR's owner); repeatable",
    )
    add(
        "--allow-tcp",
        action="append",
        metavar="CIDR",
        help="network that may be dialed over TCP and UDP (repeatable; default: none)",
    )
    add("--connect-timeout", type=float, default=5.0, help="seconds to dial a backend")
    add("--read-size", type=int, default=65536, help="bytes per backend read")
    add(
        "--write-timeout",
        type=float,
        default=30.0,
        help="seconds a backend may take no data before its relay fails",
    )
    loops.add_argument(parser)
    connections.add_arguments(parser)
    add(
        "--logging-format",
        choices=("text", "json"),
        default="text",
        help="text (default), or json: one object per line as Kubernetes components write it",
    )
