"""The steps every subresource shares before it streams.

Find the parent in the cache, check its state, read and vet its backend
endpoint, and dial it, each failure answered with the right Status. Only
after `dial` succeeds may a handler change protocols.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

from subres import fields
from subres.backends import direct, ipmi, ssh
from subres.backends import endpoint as endpoints
from subres.backends.agent import AgentUnavailable
from subres.backends.stream import BackendUnavailable
from subres.config import ANY_PORT, ParentSpec, Requirement, SubresourceSpec, field_value
from subres.engine.stream import ByteStream
from subres.kube.status import StatusError
from subres.sessions.target import Target, endpoint_url

if TYPE_CHECKING:
    from subres.server.state import State

__all__ = [
    "Backends",
    "Route",
    "Target",
    "checked",
    "connect",
    "console",
    "dial",
    "endpoint_url",
    "forward_url",
    "lookup",
    "node_of",
    "resolve",
    "vet",
]


class Backends:
    """The parents and backends of a `State`, as the sessions domain asks for them."""

    def __init__(self, state: State) -> None:
        self._state = state

    def objects(self, parent: ParentSpec) -> Iterable[Mapping[str, Any]]:
        """Every cached object of `parent`'s kind."""
        cache = self._state.caches.get(parent.resource)
        return cache.objects() if cache is not None else ()

    def follow(self, changed: Callable[[], None]) -> None:
        """Call `changed()` whenever a parent cache changes."""
        for cache in self._state.caches.values():
            cache.follow(changed)

    def follow_agents(self, changed: Callable[[], None]) -> None:
        """Call `changed()` whenever the agent serving some node changes."""
        if self._state.agents is not None:
            self._state.agents.directory.follow(changed)

    def checked(
        self, parent: ParentSpec, spec: SubresourceSpec, namespace: str, name: str
    ) -> Target:
        """The cached parent, checked for `spec`."""
        return checked(self._state, parent, spec, namespace, name)

    async def connect(self, target: Target, url: str) -> ByteStream:
        """Vet and dial `url`."""
        return await connect(self._state, target, url)


def resolve(state: State, request: web.Request, subresource: str) -> Target:
    """The parent the request names, checked for `subresource`."""
    parent = state.config.parent(request.match_info["resource"])
    spec = parent.subresources.get(subresource) if parent else None
    if parent is None or spec is None:
        raise StatusError(404, f"the server could not find the requested resource {request.path}")
    return checked(state, parent, spec, request.match_info["namespace"], request.match_info["name"])


def checked(
    state: State, parent: ParentSpec, spec: SubresourceSpec, namespace: str, name: str
) -> Target:
    """The cached parent `namespace/name`, checked for `spec` (a Status error otherwise)."""
    obj = _cached(state, parent, namespace, name)
    uid = str((obj.get("metadata") or {}).get("uid") or "")
    if parent.instance is not None:
        _check(parent.instance.requires, obj, f"{parent.kind} {namespace}/{name}")
        obj = _instance(state, parent, obj)
    target = Target(parent, spec, namespace, name, obj, uid)
    _check(spec.requires, obj, target.describe())
    return target


def console(target: Target, name: str | None) -> Target:
    """`target`, a console, as the parent's console called `name` (400 when it has none).

    No name, or the default console's, is the default console. A console's own
    state rules are checked as the default's were.
    """
    spec = target.parent.console(name or "")
    if spec is None:
        known = ", ".join(c.label for c in target.parent.all_consoles())
        raise StatusError(
            400, f"{target.describe()} has no console {(name or '')[:64]!r} (its consoles: {known})"
        )
    if spec is target.spec:
        return target
    chosen = dataclasses.replace(target, spec=spec)
    _check(spec.requires, chosen.obj, chosen.describe())
    return chosen


def lookup(state: State, request: web.Request, parent: ParentSpec) -> Mapping[str, Any]:
    """The parent object the request names, from the cache (404 or 503 otherwise)."""
    return _cached(state, parent, request.match_info["namespace"], request.match_info["name"])


def _cached(state: State, parent: ParentSpec, namespace: str, name: str) -> Mapping[str, Any]:
    cache = state.caches[parent.resource]
    if not cache.synced:
        raise StatusError(503, f"{parent.resource} are not loaded yet; try again shortly")
    obj = cache.get(namespace, name)
    if obj is None:
        raise StatusError(
            404,
            f'{parent.resource}.{parent.group} "{name}" not found in namespace "{namespace}"',
            details={"name": name, "group": parent.group, "kind": parent.resource},
        )
    return obj


def _instance(state: State, parent: ParentSpec, owner: Mapping[str, Any]) -> Mapping[str, Any]:
    """The same-named object of `parent.instance.resource`, which `owner` must own."""
    assert parent.instance is not None
    kind = state.config.parent(parent.instance.resource)
    assert kind is not None  # the config loader checked it names a parent
    meta = owner.get("metadata") or {}
    namespace, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "")
    instance = _cached(state, kind, namespace, name)
    uid = meta.get("uid")
    owners = (instance.get("metadata") or {}).get("ownerReferences") or []
    if uid and not any(isinstance(o, Mapping) and o.get("uid") == uid for o in owners):
        raise StatusError(
            409,
            f"{kind.kind} {namespace}/{name} is not owned by {parent.kind} {namespace}/{name}",
        )
    return instance


def _check(rules: tuple[Requirement, ...], obj: Mapping[str, Any], described: str) -> None:
    for rule in rules:
        value = field_value(obj, rule.path)
        if rule.holds(value):
            continue
        if rule.message:
            raise StatusError(rule.code, f"{described}: {rule.message}")
        shown = "unset" if value is None else f'"{value}"'
        wanted = " or ".join("unset" if v is None else str(v) for v in rule.values)
        verdict = f"is {wanted}" if rule.negate else f"is not {wanted}"
        raise StatusError(rule.code, f"{described} {verdict}: {rule.path} is {shown}")


def forward_url(target: Target, port: int, protocol: str = "tcp") -> str:
    """The `tcp://` URL of port `port` of the parent (403 when it is not allowed for `protocol`).

    The endpoint policy vets this URL for udp too: it is about the address.
    """
    address = field_value(target.obj, target.spec.address)
    if address is None or address == "":
        raise StatusError(
            400, f"{target.describe()} has no port-forward address ({target.spec.address})"
        )
    try:
        host = fields.substitute(target.spec.address, address)
    except fields.FieldError as exc:
        raise StatusError(400, f"{target.describe()}: {exc}") from None
    if not _port_allowed(target, port):
        raise StatusError(
            403, f"{target.describe()} does not allow forwarding to {protocol} port {port}"
        )
    return f"tcp://{host}:{port}"


def _port_allowed(target: Target, port: int) -> bool:
    if target.spec.ports == ANY_PORT:
        return True
    try:
        allowed = fields.ports(field_value(target.obj, target.spec.ports))
    except fields.FieldError as exc:
        raise StatusError(
            400, f"{target.describe()}: {target.spec.ports} is not a port list: {exc}"
        ) from None
    return allowed is not None and port in allowed


@dataclass(frozen=True)
class Route:
    """Where to dial, vetted: the backend itself, or a TCP target behind an SSH jump host."""

    backend: endpoints.Target
    jump: endpoints.Target | None = None


async def vet(state: State, target: Target, url: str) -> Route:
    """`url` (and the SSH jump host a portforward names) checked by the endpoint policy."""
    backend = await _vetted(state, target, url)
    via = target.spec.ssh.via if target.spec.ssh is not None else ""
    if not via:
        return Route(backend)
    try:
        jump_url = fields.read(via, target.obj)
    except fields.FieldError as exc:
        raise StatusError(400, f"{target.describe()} has no usable SSH jump host: {exc}") from None
    if jump_url is None or jump_url == "":
        return Route(backend)  # this parent names no jump host: the target is dialed directly
    if not isinstance(jump_url, str) or not jump_url.startswith("ssh://"):
        raise StatusError(400, f"{target.describe()}: {via} is not an ssh:// jump host")
    return Route(backend, await _vetted(state, target, jump_url))


async def _vetted(state: State, target: Target, url: str) -> endpoints.Target:
    try:
        return await endpoints.check(endpoints.parse(url), state.config.policy)
    except endpoints.EndpointError as exc:
        raise StatusError(exc.code, f"{target.describe()}: {exc}") from None


async def dial(state: State, target: Target, route: Route, *, protocol: str = "tcp") -> ByteStream:
    """Connect along a vetted route within the connect timeout (503, or the backend's code).

    An SSH endpoint or jump host goes through the shared SSH connection, an
    IPMI endpoint is a Serial-over-LAN session of this replica's; a
    node-local endpoint through its node's agent, whose refusal keeps its code
    (403 for its policy, 502/503 for its dial); anything else is dialed here.
    """
    if route.jump is not None and (protocol != "tcp" or route.backend.endpoint.scheme != "tcp"):
        raise StatusError(
            400, f"{target.describe()}: only TCP can be forwarded through an SSH jump host"
        )
    session = state.config.session
    started = time.monotonic()
    try:
        if route.jump is not None or route.backend.endpoint.scheme == "ssh":
            return await _over_ssh(state, target, route)
        if route.backend.endpoint.scheme == "ipmi":
            return await _over_ipmi(state, target, route.backend)
        node = node_of(target, route.backend.endpoint)
        if node is not None:
            return await _through_agent(
                state, target, route.backend, node=node, udp=protocol == "udp"
            )
        return await direct.dial(
            route.backend,
            udp=protocol == "udp",
            connect_timeout=session.connect_timeout,
            read_size=session.read_size,
            write_timeout=session.backend_write_timeout,
        )
    except BackendUnavailable as exc:
        message = f"{target.describe()}: {target.spec.name} unavailable: {exc}"
        raise StatusError(exc.code, message) from None
    finally:
        state.metrics.dial_seconds.labels(target.spec.name).observe(time.monotonic() - started)


def node_of(target: Target, endpoint: endpoints.Endpoint) -> str | None:
    """The node whose agent must dial `endpoint`, or None for a direct dial.

    Node-local are every unix socket, and tcp/udp where the subresource says so,
    of a parent that names its node.
    """
    if not target.parent.node:
        return None
    node = field_value(target.obj, target.parent.node)
    if not isinstance(node, str) or not node:
        return None
    if endpoint.scheme == "unix" or target.spec.node_local:
        return node
    return None


async def _through_agent(
    state: State, target: Target, vetted: endpoints.Target, *, node: str, udp: bool
) -> ByteStream:
    if state.agents is None:
        raise AgentUnavailable(f'no subres agent serves node "{node}" (none configured)')
    session = state.config.session
    return await state.agents.dial(
        node,
        vetted,
        datagram=udp,
        connect_timeout=session.connect_timeout,
        read_size=session.read_size,
        write_timeout=session.backend_write_timeout,
        heartbeat=session.relay_heartbeat,
        purpose=target.describe(),
    )


async def connect(state: State, target: Target, url: str, *, protocol: str = "tcp") -> ByteStream:
    """Vet `url` against the endpoint policy, then dial it: the one way to a backend."""
    return await dial(state, target, await vet(state, target, url), protocol=protocol)


async def _over_ssh(state: State, target: Target, route: Route) -> ByteStream:
    """A console on the SSH server `route.backend`, or a forward through `route.jump`."""
    server = route.jump or route.backend
    spec = target.spec.ssh
    if spec is None:
        raise ssh.SshError(400, f"{target.spec.name} has no `ssh` settings for {server.endpoint}")
    creds, trust = await ssh.login(
        state.secrets, spec, obj=target.obj, namespace=target.namespace, user=server.endpoint.user
    )
    if route.jump is not None:
        return await state.ssh.forward(
            route.jump, creds, trust, host=route.backend.address, port=route.backend.endpoint.port
        )
    return await state.ssh.console(
        route.backend, creds, trust, term=spec.term, command=ssh.command(spec, target.obj)
    )


async def _over_ipmi(state: State, target: Target, bmc: endpoints.Target) -> ByteStream:
    """Serial-over-LAN of the BMC `bmc`, logged in with the parent's Secret."""
    spec = target.spec.ipmi
    if spec is None or target.spec.name != "console":
        raise ipmi.IpmiError(400, f"{target.spec.name} has no `ipmi` settings for {bmc.endpoint}")
    creds = await ipmi.login(state.secrets, spec, obj=target.obj, namespace=target.namespace)
    session = state.config.session
    timing = ipmi.Timing(
        connect_timeout=session.connect_timeout,
        keepalive=session.ping_interval,
        window=4 * session.read_size,
        high_water=4 * session.read_size,
    )
    return await ipmi.open_console(bmc, creds, spec, timing=timing)
