"""The fully built runtime a server application serves from.

Options are parsed and validated elsewhere; by the time a `State` exists,
every file has been read and every component constructed.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from subres.auth.attributes import Attributes
from subres.auth.authn import Credentials
from subres.auth.authz import Decision
from subres.auth.user import UserInfo
from subres.backends import ssh
from subres.backends.agent import Agents, ClientTLS
from subres.backends.peer import Peers
from subres.config import Config
from subres.kube.cache import ParentCache
from subres.kube.secrets import NoSecrets, Secrets
from subres.server import discovery, openapi, subresource
from subres.serving.connections import Guard
from subres.serving.metrics import Metrics
from subres.serving.reclaim import Reclaimer
from subres.sessions.audit import SessionAudit
from subres.sessions.events import Events, NoEvents
from subres.sessions.members import Owners
from subres.sessions.observers import Observers
from subres.sessions.recordings import Recordings
from subres.sessions.registry import Sessions

__all__ = ["Authenticator", "Authorizer", "State"]


class Authenticator(Protocol):
    """Tells who presented the credentials."""

    async def authenticate(self, creds: Credentials) -> UserInfo:
        """The identity; raises `Unauthenticated` when the credentials fail."""
        ...


class Authorizer(Protocol):
    """Decides whether a user may do what a request asks."""

    async def authorize(self, user: UserInfo, attrs: Attributes) -> Decision:
        """The decision; may raise a `StatusError` when none can be made."""
        ...


@dataclass
class State:
    """Everything a running application needs."""

    config: Config
    caches: Mapping[str, ParentCache]
    authenticator: Authenticator
    authorizer: Authorizer
    tls_ready: bool = True
    """Whether serving certificates are loaded (for /readyz); updated by the TLS watcher."""
    draining: bool = False
    """Set on SIGTERM: /readyz fails from then on, so that endpoints stop sending requests."""
    readiness: Mapping[str, Callable[[], bool]] = field(default_factory=dict)
    """Further /readyz checks by name (cluster mode: the authentication configuration)."""
    agents: Agents | None = None
    parents_file: Path | None = None
    """Standalone: the file the parent objects are read from. Advice to change an object
    names it, since no kubectl reaches objects that live there."""
    """How node-local endpoints are reached; None when no agents are configured."""
    sessions: Sessions = field(default_factory=Sessions)
    metrics: Metrics = field(default_factory=Metrics)
    secrets: Secrets = field(default_factory=NoSecrets)
    """The Secrets parents name for SSH credentials (the apiserver, or the standalone file)."""
    audit: SessionAudit = field(default_factory=lambda: SessionAudit(None))
    """Where session start and end lines go (`--session-audit-log`)."""
    events: Events = field(default_factory=NoEvents)
    """Kubernetes Events on parent objects (cluster mode)."""
    replica: str = field(default_factory=socket.gethostname)
    """This replica's name (`--replica-name`): in Lease holders, Sessions and Events."""
    connections: Guard = field(default_factory=Guard)
    """Times every connection and caps the unauthenticated ones."""
    reclaimer: Reclaimer = field(default_factory=Reclaimer)
    """Gives memory back when sessions or connections drain."""

    peer_tls: ClientTLS | None = None
    """The replica certificate, to reach the other replicas (the agents' client certificate)."""
    owners: Owners = field(default_factory=lambda: Owners(""))
    """Which replica owns each console and display (standalone: this one, alone)."""

    def __post_init__(self) -> None:
        if not self.owners.replica:
            self.owners = Owners.alone(self.replica)
        self.backends = subresource.Backends(self)
        """Parents and backends, as the sessions domain asks for them."""
        session = self.config.session
        self.peers = Peers(
            self.peer_tls,
            connect_timeout=session.connect_timeout,
            read_size=session.read_size,
            write_timeout=session.backend_write_timeout,
            heartbeat=session.relay_heartbeat,
        )
        """How this replica opens peer sessions on the owners of units."""
        self.sessions.on_ended = lambda live: self.reclaimer.level("sessions", live)
        self.connections.on_level = self.reclaimer.level
        self.screenshot_slots = asyncio.Semaphore(self.config.session.screenshot_concurrency)
        """Captures in progress, each holding a framebuffer: bounded for memory."""
        self.observers = Observers(
            per_target=self.config.session.max_observers_per_console,
            total=self.config.session.max_observers,
        )
        """Console and display observers, bounded per target and in all for memory."""
        self.recordings = Recordings(self.config.consoles)
        """Recorded console sessions (`consoles.recordings`)."""
        self.discovery = discovery.build(self.config)
        self.openapi = openapi.build(self.config)
        session = self.config.session
        self.ssh = ssh.Pool(
            ssh.Settings(
                connect_timeout=session.connect_timeout,
                idle_timeout=session.ssh_idle_timeout,
                keepalive_interval=session.ping_interval,
                read_size=session.read_size,
            )
        )
        """Shared SSH connections; closed at shutdown."""
