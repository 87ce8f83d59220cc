"""The agent's one route: vet, dial, answer 101, then relay frames to the backend.

Who may ask: a TLS client whose certificate chains to the agent's client CA
(the handshake demands one), is meant for client authentication, and whose
common name is an allowed replica identity. What may be dialed: whatever the
agent's own policy allows (sockets in its directories, opened without
following a link and only when they and their listener belong to the
directory's owner: `backends.nofollow`; TCP and UDP only to networks it was
told to allow), never what the replica's policy says. A refusal is a `Status` (401 for the caller's
identity, 403 with the policy's reason, 503 when the dial fails), sent
before any upgrade.

A relay whose replica asks for heartbeats beats back; one whose replica fell
silent is dropped and its backend closed, so that a socket which takes one
connection at a time (a VM's serial port) is free for the next. When the
agent stops, every relay is ended at once with an ERROR frame saying so.
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import hdrs, web
from aiohttp.typedefs import Middleware

from subres.backends import direct, nofollow
from subres.backends import endpoint as endpoints
from subres.backends.stream import BackendUnavailable
from subres.config import EndpointPolicySpec
from subres.engine.pump import Ending, Traffic, pump
from subres.engine.stream import ByteStream
from subres.engine.upgrade import UpgradedSocket, upgrade
from subres.kube.status import StatusError
from subres.protocol import relay
from subres.serving.tls import replica_caller

__all__ = ["CALLER", "Relay", "authenticated", "end_all", "handle", "identity"]

log = logging.getLogger(__name__)

CALLER = web.RequestKey("caller", str)
"""Request key of the replica identity `identity` admitted."""
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Relay:
    """What the agent's route needs: its node, policy, callers and dial settings."""

    node: str
    policy: EndpointPolicySpec
    """Schemes `unix`, plus `tcp` when networks are allowed, and those networks."""
    socket_dirs: tuple[nofollow.SocketDir, ...]
    """Where sockets may be dialed, and who must own them."""
    allowed_names: frozenset[str]
    connect_timeout: float
    read_size: int
    write_timeout: float
    """Seconds a backend may take no data before the relay fails."""
    live: set[_Replica] = field(default_factory=set, compare=False)
    """The relays running now (`end_all` ends them)."""


def identity(settings: Relay) -> Middleware:
    """Middleware that lets only an allowed replica's requests reach the route (401 otherwise)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        request[CALLER] = _caller(settings, request)
        return await handler(request)

    return middleware


def authenticated(request: web.Request) -> bool:
    """Whether `identity` let this request through."""
    return CALLER in request


async def handle(settings: Relay, request: web.Request) -> web.StreamResponse:
    """Check the endpoint, dial, upgrade, relay until the session ends."""
    caller = request[CALLER]
    if request.headers.get(hdrs.UPGRADE, "").lower() != relay.UPGRADE:
        raise StatusError(400, f"a relay request needs `Upgrade: {relay.UPGRADE}`")
    transport = _transport(request.headers.get(relay.TRANSPORT_HEADER, "stream"))
    url = request.headers.get(relay.ENDPOINT_HEADER, "")
    purpose = request.headers.get(relay.FOR_HEADER, "")
    target = await _vet(settings, url, transport)
    backend = await _dial(settings, target, transport)
    log.info("relaying %s for %s (%s) as %s", target.endpoint, purpose or "?", transport, caller)
    beat = relay.heartbeat_interval(request.headers.get(relay.HEARTBEAT_HEADER))
    headers: list[tuple[str, str]] = [(hdrs.CONNECTION, "Upgrade"), (hdrs.UPGRADE, relay.UPGRADE)]
    if beat is not None:
        headers.append((relay.HEARTBEAT_HEADER, f"{beat:g}"))
    try:
        response, peer = await upgrade(request, headers)
        if request.transport is not None:
            # As the replica does: a few frames in flight rather than a pause per frame.
            request.transport.set_write_buffer_limits(high=4 * settings.read_size)
        if beat is not None:
            peer.start_heartbeat(beat, relay.heartbeat())
        replica = _Replica(peer, datagram=transport is relay.Transport.DATAGRAM)
        settings.live.add(replica)
        try:
            ended = await _relay(replica, backend)
        finally:
            settings.live.discard(replica)
        log.info("relay to %s ended: %s", target.endpoint, ended)
        await peer.close()
    finally:
        await backend.close()
    return response


def end_all(settings: Relay) -> None:
    """The agent is stopping: end every relay now, telling its replica why."""
    reason = f'the subres agent of node "{settings.node}" is shutting down'
    for replica in list(settings.live):
        replica.end(reason)


def _caller(settings: Relay, request: web.Request) -> str:
    """The replica identity of the client certificate (401 otherwise)."""
    return replica_caller(request.transport, settings.allowed_names)


def _transport(text: str) -> relay.Transport:
    try:
        return relay.Transport(text)
    except ValueError:
        raise StatusError(400, f"unknown {relay.TRANSPORT_HEADER} {text!r}") from None


async def _vet(settings: Relay, url: str, transport: relay.Transport) -> endpoints.Target:
    """The endpoint as this agent's policy allows it, or a 400/403 naming the node."""
    try:
        endpoint = endpoints.parse(url)
        if endpoint.scheme == "unix":
            if transport is relay.Transport.DATAGRAM:
                raise endpoints.EndpointInvalid("unix endpoints are streams, not datagrams")
            # Read as written: the dial opens it beneath its directory, following no link.
            nofollow.locate(endpoint.path, settings.socket_dirs)
            return endpoints.Target(endpoint)
        return await endpoints.check(endpoint, settings.policy)
    except (endpoints.EndpointError, nofollow.SocketRefused) as exc:
        raise _refused(settings, url, exc) from None


def _refused(settings: Relay, url: str, exc: Exception) -> StatusError:
    where = f'agent on node "{settings.node}"'
    log.warning("%s refused %r: %s", where, url, exc)
    return StatusError(getattr(exc, "code", 403), f"{where}: {exc}")


async def _dial(
    settings: Relay, target: endpoints.Target, transport: relay.Transport
) -> ByteStream:
    try:
        if target.endpoint.scheme == "unix":
            return await nofollow.dial(
                target.endpoint.path,
                settings.socket_dirs,
                connect_timeout=settings.connect_timeout,
                read_size=settings.read_size,
                write_timeout=settings.write_timeout,
            )
        return await direct.dial(
            target,
            udp=transport is relay.Transport.DATAGRAM,
            connect_timeout=settings.connect_timeout,
            read_size=settings.read_size,
            write_timeout=settings.write_timeout,
        )
    except nofollow.SocketRefused as exc:
        raise _refused(settings, target.endpoint.path, exc) from None
    except BackendUnavailable as exc:
        raise StatusError(503, f'agent on node "{settings.node}": {exc}') from None


class _Replica:
    """The replica's side of a relay as the pump's `ClientStream`: frames in, frames out.

    Its EOF frame is a half-close; its ERROR frame, or its hanging up, the end.
    The pump's `abort` reaches it as an ERROR frame with the reason.
    """

    def __init__(self, peer: UpgradedSocket, *, datagram: bool) -> None:
        self._peer = peer
        self._decoder = relay.FrameDecoder(partial=not datagram)
        self._events: deque[relay.Event] = deque()
        self._gone = False
        self.why = "the replica closed the relay"

    def end(self, reason: str) -> None:
        """End the relay from here: an ERROR frame with `reason`, and the connection closed."""
        self.why = reason
        self._peer.end(relay.error(reason))

    @property
    def gone(self) -> bool:
        return self._gone

    async def read(self) -> bytes:
        while not self._gone:
            if not self._events:
                chunk = await self._peer.read()
                if not chunk:
                    self._gone = True
                    if self._peer.silent:
                        self.why = f"the replica stopped answering ({self._peer.silent})"
                    break
                try:
                    self._events.extend(self._decoder.feed(chunk))
                except relay.FrameError as exc:
                    self._end(f"bad frame from the replica: {exc}")
                    break
                continue
            event = self._events.popleft()
            if isinstance(event, relay.DataReceived):
                if event.data:
                    return event.data
            elif isinstance(event, relay.EofReceived):
                return b""
            elif isinstance(event, relay.ErrorReceived):
                self._end(f"the replica failed: {event.reason}")
        return b""

    def _end(self, why: str) -> None:
        self._gone = True
        self.why = why

    async def write(self, data: bytes) -> None:
        await self._peer.write(relay.data(data))

    async def write_eof(self) -> None:
        await self._peer.write(relay.eof())

    async def abort(self, reason: str) -> None:
        self.why = reason
        with contextlib.suppress(OSError, RuntimeError):
            await self._peer.write(relay.error(reason))

    async def close(self) -> None:
        await self._peer.close()


async def _relay(replica: _Replica, backend: ByteStream) -> str:
    """Frames from the replica to the backend and back, until the replica leaves.

    The backend's end (EOF, or an error with its reason) goes to the replica
    as a frame; the replica then closes, which is what ends the relay.
    """
    outcome = await pump(replica, backend, Traffic())
    return replica.why if outcome.ending is Ending.CLIENT else outcome.reason
