"""The steps every subresource shares before it streams.

Find the parent in the cache, check its state, read and vet its backend
endpoint, and dial it, each failure answered with the right Status. Only
after `dial` succeeds may a handler change protocols.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from subres.backends import direct
from subres.backends import endpoint as endpoints
from subres.backends.agent import AgentUnavailable
from subres.backends.stream import BackendUnavailable, ByteStream
from subres.config import ParentSpec, SubresourceSpec, field_value
from subres.kube.status import StatusError
from subres.server.state import State

__all__ = [
    "Target",
    "connect",
    "dial",
    "endpoint_url",
    "forward_url",
    "node_of",
    "resolve",
    "vet",
]


@dataclass(frozen=True)
class Target:
    """A parent object that passed its checks, and the subresource asked of it."""

    parent: ParentSpec
    spec: SubresourceSpec
    namespace: str
    name: str
    obj: Mapping[str, Any]

    def describe(self) -> str:
        """`Machine default/vm1`."""
        return f"{self.parent.kind} {self.namespace}/{self.name}"


def resolve(state: State, request: web.Request, subresource: str) -> Target:
    """The parent the request names, checked for `subresource`."""
    namespace = request.match_info["namespace"]
    name = request.match_info["name"]
    parent = state.config.parent(request.match_info["resource"])
    spec = parent.subresources.get(subresource) if parent else None
    if parent is None or spec is None:
        raise StatusError(404, f"the server could not find the requested resource {request.path}")
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
    target = Target(parent, spec, namespace, name, obj)
    _check_state(target)
    return target


def _check_state(target: Target) -> None:
    for rule in target.spec.requires:
        value = field_value(target.obj, rule.path)
        if value not in rule.values:
            shown = "unset" if value is None else f'"{value}"'
            wanted = " or ".join(rule.values)
            raise StatusError(
                409,
                f"{target.describe()} is not {wanted}: {rule.path} is {shown}",
            )


def endpoint_url(target: Target) -> str:
    """The backend URL the parent names for its subresource (400 when it has none)."""
    url = field_value(target.obj, target.spec.endpoint)
    if not isinstance(url, str) or not url:
        raise StatusError(
            400, f"{target.describe()} has no {target.spec.name} ({target.spec.endpoint} is empty)"
        )
    return url


def forward_url(target: Target, port: int, protocol: str = "tcp") -> str:
    """The `tcp://` URL of port `port` of the parent (403 when it is not allowed for `protocol`).

    The endpoint policy vets this URL for udp too: it is about the address.
    """
    address = field_value(target.obj, target.spec.address)
    allowed = field_value(target.obj, target.spec.ports) or []
    if not isinstance(address, str) or not address:
        raise StatusError(
            400, f"{target.describe()} has no port-forward address ({target.spec.address})"
        )
    if not isinstance(allowed, list) or port not in allowed:
        raise StatusError(
            403, f"{target.describe()} does not allow forwarding to {protocol} port {port}"
        )
    host = f"[{address}]" if ":" in address else address
    return f"tcp://{host}:{port}"


async def vet(state: State, target: Target, url: str) -> endpoints.Target:
    """`url` parsed and checked by the endpoint policy (400/403/503 otherwise)."""
    try:
        return await endpoints.check(endpoints.parse(url), state.config.policy)
    except endpoints.EndpointError as exc:
        raise StatusError(exc.code, f"{target.describe()}: {exc}") from None


async def dial(
    state: State, target: Target, vetted: endpoints.Target, *, protocol: str = "tcp"
) -> ByteStream:
    """Connect to a vetted endpoint within the connect timeout (503 Status otherwise).

    A node-local endpoint goes through its node's agent, whose refusal keeps its
    code (403 for its policy, 502/503 for its dial); anything else is dialed here.
    """
    session = state.config.session
    started = time.monotonic()
    try:
        node = node_of(target, vetted.endpoint)
        if node is not None:
            return await _through_agent(state, target, vetted, node=node, udp=protocol == "udp")
        return await direct.dial(
            vetted,
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
        purpose=target.describe(),
    )


async def connect(state: State, target: Target, url: str, *, protocol: str = "tcp") -> ByteStream:
    """Vet `url` against the endpoint policy, then dial it: the one way to a backend."""
    return await dial(state, target, await vet(state, target, url), protocol=protocol)
