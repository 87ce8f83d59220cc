"""The server configuration file (`--config`): what to serve and how to reach backends.

Owns the typed settings, their defaults (the Machine CRD of DESIGN.md) and the
YAML loader that validates them. Every layer reads these dataclasses; none
parses YAML itself.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "SUBRESOURCES",
    "Config",
    "ConfigError",
    "EndpointPolicySpec",
    "ParentSpec",
    "Requirement",
    "SessionSpec",
    "SubresourceSpec",
    "field_value",
    "load",
    "parse",
]

SUBRESOURCES = ("console", "vnc", "screenshot", "portforward")


class ConfigError(ValueError):
    """The configuration file is not valid."""


@dataclass(frozen=True)
class Requirement:
    """A state rule: the field at `path` must hold one of `values`."""

    path: str
    """Field path in the parent object, e.g. `.status.phase`."""
    values: tuple[str, ...]
    """Accepted values; anything else answers 409 naming the value found."""


@dataclass(frozen=True)
class SubresourceSpec:
    """How one subresource finds its backend in a parent object."""

    name: str
    """One of `SUBRESOURCES`."""
    endpoint: str = ""
    """Field path of the backend URL (`tcp://`, `unix://`); empty for portforward."""
    address: str = ""
    """portforward: field path of the address to dial."""
    ports: str = ""
    """portforward: field path of the list of allowed ports."""
    requires: tuple[Requirement, ...] = ()
    """State rules checked before dialing."""
    node_local: bool = False
    """tcp (and udp) endpoints are on the parent's node: its agent dials them (unix always is)."""


@dataclass(frozen=True)
class ParentSpec:
    """A parent kind: the CRD it comes from and the subresources it offers."""

    resource: str
    """Plural resource name in our API group, e.g. `machines`."""
    singular: str
    kind: str
    group: str
    """The CRD's group (the parent objects are read from there)."""
    version: str
    crd_resource: str
    subresources: Mapping[str, SubresourceSpec]
    node: str = ".status.nodeName"
    """Field path of the node the machine runs on; its node-local endpoints go through
    that node's agent. Empty: every endpoint is dialed directly."""

    @property
    def api_version(self) -> str:
        """The `apiVersion` the parent objects carry."""
        return f"{self.group}/{self.version}"


@dataclass(frozen=True)
class EndpointPolicySpec:
    """What subres may dial, whatever a parent object says."""

    schemes: tuple[str, ...] = ("tcp", "unix")
    """Endpoint URL schemes allowed."""
    allow_cidrs: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = (
        ipaddress.ip_network("0.0.0.0/0"),
        ipaddress.ip_network("::/0"),
    )
    """TCP targets must fall in one of these networks..."""
    deny_cidrs: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = (
        ipaddress.ip_network("169.254.0.0/16"),
        ipaddress.ip_network("fe80::/10"),
    )
    """...and in none of these (link-local holds cloud metadata services)."""
    socket_dirs: tuple[str, ...] = ("/run", "/var/run")
    """unix sockets must lie under one of these directories."""


@dataclass(frozen=True)
class SessionSpec:
    """Live-session tuning."""

    ping_interval: float = 10.0
    """Seconds between WebSocket pings; a peer that misses a pong is closed."""
    connect_timeout: float = 5.0
    """Seconds allowed to dial a backend before answering 503."""
    read_size: int = 65536
    """Bytes asked of the backend per read (64 KiB halves CPU against 4 KiB)."""
    max_message: int = 1 << 20
    """Largest WebSocket message accepted from a client."""
    screenshot_timeout: float = 10.0
    """Seconds a VNC server has, once dialed, to deliver a screenshot before 504."""
    backend_write_timeout: float = 30.0
    """Seconds a write may wait on a backend that takes no byte before the session ends (1011)."""


@dataclass(frozen=True)
class Config:
    """Everything the configuration file says."""

    group: str = "subresources.subres.dev"
    version: str = "v1alpha1"
    parents: tuple[ParentSpec, ...] = field(default_factory=lambda: (_default_parent(),))
    policy: EndpointPolicySpec = EndpointPolicySpec()
    session: SessionSpec = SessionSpec()

    def parent(self, resource: str) -> ParentSpec | None:
        """The parent kind served under `resource`."""
        return next((p for p in self.parents if p.resource == resource), None)


def _default_parent() -> ParentSpec:
    running = (Requirement(".status.phase", ("Running",)),)
    subs = {
        "console": SubresourceSpec("console", endpoint=".spec.console.endpoint", requires=running),
        "vnc": SubresourceSpec("vnc", endpoint=".spec.vnc.endpoint", requires=running),
        "screenshot": SubresourceSpec(
            "screenshot", endpoint=".spec.vnc.endpoint", requires=running
        ),
        "portforward": SubresourceSpec(
            "portforward",
            address=".spec.portForward.address",
            ports=".spec.portForward.ports",
            requires=running,
        ),
    }
    return ParentSpec(
        resource="machines",
        singular="machine",
        kind="Machine",
        group="subres.dev",
        version="v1alpha1",
        crd_resource="machines",
        subresources=subs,
    )


def field_value(obj: Mapping[str, Any], path: str) -> Any:
    """The value at a `.a.b.c` field path, or None when any step is missing."""
    value: Any = obj
    for part in path.strip(".").split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value


def load(path: Path | None) -> Config:
    """The configuration in `path`, or the defaults when there is none."""
    if path is None:
        return Config()
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return parse(data or {})


def parse(data: Any) -> Config:
    """A validated `Config` from the file's decoded YAML."""
    doc = _mapping(data, "config", {"group", "version", "parents", "endpointPolicy", "session"})
    default = Config()
    parents = doc.get("parents")
    return Config(
        group=_str(doc.get("group", default.group), "group"),
        version=_str(doc.get("version", default.version), "version"),
        parents=tuple(_parent(p) for p in _list(parents, "parents"))
        if parents is not None
        else default.parents,
        policy=_policy(doc.get("endpointPolicy", {})),
        session=_session(doc.get("session", {})),
    )


def _parent(data: Any) -> ParentSpec:
    keys = {"resource", "singular", "kind", "source", "subresources", "node"}
    doc = _mapping(data, "parent", keys)
    resource = _str(doc.get("resource"), "parent.resource")
    source = _mapping(doc.get("source"), f"{resource}.source", {"group", "version", "resource"})
    subs = _mapping(doc.get("subresources"), f"{resource}.subresources", set(SUBRESOURCES))
    return ParentSpec(
        resource=resource,
        singular=_str(doc.get("singular", resource.rstrip("s")), f"{resource}.singular"),
        kind=_str(doc.get("kind"), f"{resource}.kind"),
        group=_str(source.get("group"), f"{resource}.source.group"),
        version=_str(source.get("version"), f"{resource}.source.version"),
        crd_resource=_str(source.get("resource", resource), f"{resource}.source.resource"),
        subresources={name: _subresource(name, spec) for name, spec in subs.items()},
        node=_str(doc.get("node", ParentSpec.node), f"{resource}.node"),
    )


def _subresource(name: str, data: Any) -> SubresourceSpec:
    doc = _mapping(data, name, {"endpoint", "address", "ports", "require", "nodeLocal"})
    if name == "portforward":
        if "address" not in doc or "ports" not in doc:
            raise ConfigError("portforward needs `address` and `ports` field paths")
    elif "endpoint" not in doc:
        raise ConfigError(f"{name} needs an `endpoint` field path")
    require = _mapping(doc.get("require", {}), f"{name}.require", None)
    node_local = doc.get("nodeLocal", False)
    if not isinstance(node_local, bool):
        raise ConfigError(f"{name}.nodeLocal must be true or false")
    return SubresourceSpec(
        name=name,
        endpoint=_str(doc.get("endpoint", ""), f"{name}.endpoint"),
        address=_str(doc.get("address", ""), f"{name}.address"),
        ports=_str(doc.get("ports", ""), f"{name}.ports"),
        requires=tuple(
            Requirement(path, tuple(_str(v, path) for v in _list(values, path)))
            for path, values in require.items()
        ),
        node_local=node_local,
    )


def _policy(data: Any) -> EndpointPolicySpec:
    keys = {"schemes", "allowCIDRs", "denyCIDRs", "socketDirs"}
    doc = _mapping(data, "endpointPolicy", keys)
    default = EndpointPolicySpec()
    return EndpointPolicySpec(
        schemes=tuple(_str(s, "schemes") for s in _list(doc.get("schemes", default.schemes), "")),
        allow_cidrs=_networks(doc.get("allowCIDRs"), default.allow_cidrs),
        deny_cidrs=_networks(doc.get("denyCIDRs"), default.deny_cidrs),
        socket_dirs=tuple(
            _str(d, "socketDirs") for d in _list(doc.get("socketDirs", default.socket_dirs), "")
        ),
    )


def _networks(
    data: Any, default: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]
) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    if data is None:
        return default
    try:
        return tuple(ipaddress.ip_network(_str(c, "CIDR")) for c in _list(data, "CIDRs"))
    except ValueError as exc:
        raise ConfigError(f"bad CIDR: {exc}") from None


def _session(data: Any) -> SessionSpec:
    keys = {
        "pingInterval",
        "connectTimeout",
        "readSize",
        "maxMessage",
        "screenshotTimeout",
        "backendWriteTimeout",
    }
    doc = _mapping(data, "session", keys)
    default = SessionSpec()
    return SessionSpec(
        ping_interval=_positive(doc.get("pingInterval", default.ping_interval), "pingInterval"),
        connect_timeout=_positive(
            doc.get("connectTimeout", default.connect_timeout), "connectTimeout"
        ),
        read_size=int(_positive(doc.get("readSize", default.read_size), "readSize")),
        max_message=int(_positive(doc.get("maxMessage", default.max_message), "maxMessage")),
        screenshot_timeout=_positive(
            doc.get("screenshotTimeout", default.screenshot_timeout), "screenshotTimeout"
        ),
        backend_write_timeout=_positive(
            doc.get("backendWriteTimeout", default.backend_write_timeout), "backendWriteTimeout"
        ),
    )


def _mapping(data: Any, what: str, keys: set[str] | None) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ConfigError(f"{what} must be a mapping")
    unknown = set(data) - keys if keys is not None else set()
    if unknown:
        raise ConfigError(f"{what}: unknown keys {sorted(unknown)}")
    return data


def _list(data: Any, what: str) -> list[Any]:
    if not isinstance(data, list | tuple):
        raise ConfigError(f"{what} must be a list")
    return list(data)


def _str(data: Any, what: str) -> str:
    if not isinstance(data, str):
        raise ConfigError(f"{what} must be a string")
    return data


def _positive(data: Any, what: str) -> float:
    if isinstance(data, bool) or not isinstance(data, int | float) or data <= 0:
        raise ConfigError(f"{what} must be a positive number")
    return float(data)
