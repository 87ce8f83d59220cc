"""What the sessions domain needs of the program it runs in: `Runtime`, and `Who` opened a session.

The server's `State` is one; sessions/ never imports the server. Reaching
a backend (the endpoint policy, agents, SSH) is the program's business,
injected as `Backends`; so is finding a parent in the caches.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from subres.auth.user import UserInfo
from subres.backends.peer import Peers
from subres.config import Config, ParentSpec, SubresourceSpec
from subres.engine.stream import ByteStream
from subres.serving.metrics import Metrics
from subres.sessions.audit import SessionAudit
from subres.sessions.events import Events
from subres.sessions.observers import Observers
from subres.sessions.recordings import Recordings
from subres.sessions.registry import Sessions
from subres.sessions.target import Target

if TYPE_CHECKING:
    from subres.sessions.members import Owners

__all__ = ["Backends", "Runtime", "Who"]


class Backends(Protocol):
    """Parents and the backends they name, as the program finds and dials them."""

    def objects(self, parent: ParentSpec) -> Iterable[Mapping[str, Any]]:
        """Every cached object of `parent`'s kind."""
        ...

    def follow(self, changed: Callable[[], None]) -> None:
        """Call `changed()` (from any thread) whenever a cached parent changes."""
        ...

    def follow_agents(self, changed: Callable[[], None]) -> None:
        """Call `changed()` (on the loop) whenever the agent serving some node changes."""
        ...

    def checked(
        self, parent: ParentSpec, spec: SubresourceSpec, namespace: str, name: str
    ) -> Target:
        """The cached parent, checked for `spec` (a `StatusError` otherwise)."""
        ...

    async def connect(self, target: Target, url: str) -> ByteStream:
        """Vet `url` against the endpoint policy and dial it (a `StatusError` otherwise)."""
        ...


class Runtime(Protocol):
    """The parts of a running program that sessions use."""

    @property
    def config(self) -> Config: ...
    @property
    def sessions(self) -> Sessions: ...
    @property
    def metrics(self) -> Metrics: ...
    @property
    def audit(self) -> SessionAudit: ...
    @property
    def events(self) -> Events: ...
    @property
    def recordings(self) -> Recordings: ...
    @property
    def observers(self) -> Observers: ...
    @property
    def replica(self) -> str: ...
    @property
    def backends(self) -> Backends: ...
    @property
    def owners(self) -> Owners: ...
    @property
    def peers(self) -> Peers: ...


@dataclass(frozen=True)
class Who:
    """Who opened a session, from where, under which request."""

    identity: UserInfo
    """The user as authenticated by the front replica, whole (it crosses a peer hop so)."""
    client: str
    """The client's address as the front replica saw it (kube-apiserver's, behind it)."""
    request_id: str
    transport: asyncio.Transport | None = None
    """The client's connection on this replica, to drop at once (None when relayed)."""

    @property
    def user(self) -> str:
        """The user's name."""
        return self.identity.name

    @property
    def groups(self) -> tuple[str, ...]:
        """Every group of the user."""
        return self.identity.groups
