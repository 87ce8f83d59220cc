"""The server configuration file (`--config`): what to serve and how to reach backends.

Owns the typed settings, their defaults (the Machine CRD of DESIGN.md) and the
YAML loader that validates them. Every layer reads these dataclasses; none
parses YAML itself.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from subres import fields, policies
from subres.policies import LimitRule, Moderation
from subres.protocol import relay

__all__ = [
    "ANY_PORT",
    "DEFAULT_CONSOLE",
    "DEFAULT_DENY_CIDRS",
    "DEFAULT_SOCKET_DIR",
    "SLOT",
    "SUBRESOURCES",
    "TRUSTED_FIELDS",
    "TRUSTED_PREFIX",
    "USB_SLOTS",
    "Config",
    "ConfigError",
    "ConsolesSpec",
    "EndpointPolicySpec",
    "InstanceSpec",
    "ParentSpec",
    "Requirement",
    "Scalar",
    "SessionSpec",
    "SshSpec",
    "SubresourceSpec",
    "field_value",
    "load",
    "parse",
    "slot_source",
]

SUBRESOURCES = ("console", "vnc", "screenshot", "portforward", "usbredir")
ANY_PORT = "any"
"""`ports: any`: the parent kind opts in to forwarding every port (KubeVirt restricts none)."""

Scalar = str | int | float | bool | None
"""A value a state rule compares a field with; None is a field that is unset."""

DEFAULT_CONSOLE = "serial0"
"""What a parent's console is called when its configuration names it nothing else."""
MAX_CONSOLES = 16
"""Consoles one parent kind may name: each is a kept connection, a hub and a recording."""
SLOT = "{slot}"
"""In a usbredir endpoint template, the slot's number (0, 1, …)."""
USB_SLOTS = 4
"""usbredir slots a machine has at most, by default: KubeVirt's UsbClientPassthroughMaxNumberOf."""

DEFAULT_DENY_CIDRS = (
    "0.0.0.0/8",  # unspecified: "this host"
    "127.0.0.0/8",  # loopback: subres's own pod and whatever listens beside it
    "169.254.0.0/16",  # link-local: AWS, GCP, Azure, OpenStack... metadata at 169.254.169.254
    "224.0.0.0/4",  # multicast
    "255.255.255.255/32",  # broadcast
    "100.100.100.200/32",  # Alibaba Cloud metadata
    "168.63.129.16/32",  # Azure WireServer
    "192.0.0.192/32",  # Oracle Cloud legacy metadata
    "::/128",  # unspecified
    "::1/128",  # loopback
    "fe80::/10",  # link-local (OpenStack metadata at fe80::a9fe:a9fe)
    "ff00::/8",  # multicast
    "fd00:ec2::254/128",  # AWS metadata over IPv6
    "fd20:ce::254/128",  # GCP metadata for IPv6-only instances
)
"""The endpoint policy's default `denyCIDRs`: nothing a parent object should ever reach."""

DEFAULT_SOCKET_DIR = "/run/subres/sockets"
"""The default `socketDirs`: a directory of subres's own, where an operator links or
mounts the sockets subres may reach (never all of `/run`, which holds container
runtimes' sockets)."""


OPT_IN = ("never", "annotated", "always")
"""How a console opts in to being kept or recorded."""
RECORD = (*OPT_IN, "required")
"""How a console or display opts in to being recorded: `required` is `always`, and no
session without its recording (fail closed)."""
RECORDED = ("console", "vnc")


class ConfigError(ValueError):
    """The configuration file is not valid."""


@dataclass(frozen=True)
class Requirement:
    """A state rule: the field at `path` must hold one of `values` (or none of them)."""

    path: str
    """Field path in the parent object, e.g. `.status.phase`."""
    values: tuple[Scalar, ...]
    """Accepted values (`in`), or with `negate` the refused ones (`notIn`)."""
    negate: bool = False
    """True for `notIn`: the rule fails when the field holds one of `values`."""
    code: int = 409
    """HTTP code of the Status when the rule fails (KubeVirt: 400 for "not running")."""
    message: str = ""
    """The Status message when the rule fails; empty for one naming the field and value."""

    def holds(self, value: Any) -> bool:
        """Whether the field's `value` satisfies the rule (`true` never equals `1`; `null`
        matches an unset field only)."""
        found = any(
            (v is None and value is None)
            or (v is not None and isinstance(v, bool) == isinstance(value, bool) and v == value)
            for v in self.values
        )
        return found != self.negate


@dataclass(frozen=True)
class SshSpec:
    """How a subresource logs in to an SSH server: `ssh://` endpoints, or a jump host."""

    credentials: str = ""
    """Field path of the name of the Secret (in the parent's namespace) with the credentials."""
    host_key: str = ""
    """Field path of a pinned host key fingerprint (`SHA256:…`), used without known_hosts."""
    command: str = ""
    """console: run this, not a login shell (`console 1`, `virsh console {.metadata.name}`)."""
    term: str = "xterm-256color"
    """console: TERM of the PTY."""
    via: str = ""
    """portforward: the `ssh://` jump host (field path or template) the targets are dialed from."""


@dataclass(frozen=True)
class SubresourceSpec:
    """How one subresource finds its backend in a parent object."""

    name: str
    """One of `SUBRESOURCES`."""
    endpoint: str = ""
    """The backend URL (`tcp://`, `unix://`): a field path (`.spec.console.endpoint`), or a
    template with field paths in braces (`unix:///run/vms/{.metadata.name}/serial.sock`);
    empty for portforward."""
    address: str = ""
    """portforward: field path of the address to dial."""
    ports: str = ""
    """portforward: field path of the allowed ports, or `any`."""
    requires: tuple[Requirement, ...] = ()
    """State rules checked before dialing, in order; the first that fails answers."""
    ssh: SshSpec | None = None
    """SSH login for `ssh://` endpoints (and for portforward, the jump host)."""
    node_local: bool = False
    """tcp (and udp) endpoints are on the parent's node: its agent dials them (unix always is)."""
    keep: str = "annotated"
    """console: keep its backend connection open while nobody is attached: `never`,
    `always`, or `annotated` (when the parent carries `consoles.keepAnnotation: "true"`)."""
    record: str = "annotated"
    """console and vnc: record sessions (when `consoles.recordings.directory` is set):
    `never`, `always`, `required` (always, and a session whose recording cannot be
    written is refused or ended), or `annotated` (`consoles.recordAnnotation` for a
    console, `consoles.recordDisplayAnnotation` for a display, "true")."""
    unit: str = ""
    """Which of the parent's units of this subresource this spec describes: a console's
    name, a usbredir slot's number; "" for the only one (or the default console)."""
    slots: int = 0
    """usbredir: how many slots (one client each) a machine has at most; its endpoint
    names one URL per slot (a list, or a template with `{slot}`)."""
    label: str = ""
    """console: the name clients pick it by (`?console=serial1`); the default console's
    is `name:` in the file (`serial0`), another's its key under `consoles:`."""
    consoles: tuple[SubresourceSpec, ...] = ()
    """The default console's: the parent's other consoles, each a spec of its own."""

    def opted_in(self, mode: str, obj: Mapping[str, Any], annotation: str) -> bool:
        """Whether `obj` opts in under `mode` (this spec's `keep` or `record`)."""
        if mode != "annotated":
            return mode == "always"
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        return isinstance(annotations, Mapping) and annotations.get(annotation) == "true"


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
    instance: InstanceSpec | None = None
    """When set, subresources act on an owned object of another parent kind (a KubeVirt
    VirtualMachine's VirtualMachineInstance); `subresources` then read that object."""
    node: str = ".status.nodeName"
    """Field path of the node the machine runs on; its node-local endpoints go through
    that node's agent. Empty: every endpoint is dialed directly."""

    @property
    def api_version(self) -> str:
        """The `apiVersion` the parent objects carry."""
        return f"{self.group}/{self.version}"

    def all_consoles(self) -> tuple[SubresourceSpec, ...]:
        """Every console of the kind, the default one first; none without a console."""
        console = self.subresources.get("console")
        return (console, *console.consoles) if console is not None else ()

    def console(self, name: str = "") -> SubresourceSpec | None:
        """The console called `name`, or the default one for ""."""
        consoles = self.all_consoles()
        if not name:
            return consoles[0] if consoles else None
        return next((c for c in consoles if c.label == name), None)


@dataclass(frozen=True)
class InstanceSpec:
    """Where a parent's subresources are served from: the same-named object of another kind."""

    resource: str
    """The other parent kind (`resource` of another entry of `parents`)."""
    requires: tuple[Requirement, ...] = ()
    """Rules on this parent, checked before the instance is looked up."""


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
    deny_cidrs: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = tuple(
        ipaddress.ip_network(n) for n in DEFAULT_DENY_CIDRS
    )
    """...and in none of these. Every rule is checked against every form of the
    address (IPv4-mapped, IPv4-compatible, NAT64, 6to4 and Teredo unwrapped)."""
    socket_dirs: tuple[str, ...] = (DEFAULT_SOCKET_DIR,)
    """unix sockets must lie under one of these directories once symlinks are resolved."""


@dataclass(frozen=True)
class SessionSpec:
    """Live-session tuning."""

    ping_interval: float = 10.0
    """Seconds between WebSocket pings; a peer that misses a pong is closed."""
    relay_heartbeat: float = 2.0
    """Seconds between heartbeats on relays to node agents and to other replicas; a relay
    that hears nothing for `protocol.relay.MISSED_BEATS` of them is dropped."""
    connect_timeout: float = 5.0
    """Seconds allowed to dial a backend before answering 503."""
    read_size: int = 65536
    """Bytes asked of the backend per read (64 KiB halves CPU against 4 KiB)."""
    max_message: int = 1 << 20
    """Largest WebSocket message accepted from a client."""
    screenshot_timeout: float = 10.0
    """Seconds a VNC server has, once dialed, to deliver a screenshot before 504; also
    the longest a screenshot waits for a capture slot (then 429), and the longest
    its PNG may take to reach the client."""
    screenshot_max_pixels: int = 4096 * 4096
    """Largest framebuffer (width * height) captured; a capture holds 3 bytes a pixel."""
    screenshot_concurrency: int = 2
    """Screenshots captured at once; more wait for a slot. Peak memory is about this
    many framebuffers (docs/performance.md: Screenshots)."""
    backend_write_timeout: float = 30.0
    """Seconds a write may wait on a backend that takes no byte before the session ends (1011)."""
    ssh_idle_timeout: float = 60.0
    """Seconds a shared SSH connection stays open after its last session ended."""
    observer_backlog: int = 1 << 20
    """Bytes an observer may fall behind a console before it is cut off (close code 4002)."""
    max_observers: int = 100
    """Observers (of consoles and displays) one replica serves at once; more get 429."""
    max_observers_per_console: int = 20
    """Observers one console, or one display, may have at once; more get 429."""


@dataclass(frozen=True)
class ConsolesSpec:
    """Kept and recorded consoles: annotations, bounds and where recordings go."""

    keep_annotation: str = "subres.dev/keep-console"
    """Annotation that opts a parent in to a kept console (value "true")."""
    record_annotation: str = "subres.dev/record-console"
    """Annotation that opts a parent in to recorded console sessions (value "true")."""
    record_display_annotation: str = "subres.dev/record-display"
    """Annotation that opts a parent in to recorded display (vnc) sessions (value "true")."""
    scrollback: int = 64 * 1024
    """Bytes of output a kept console keeps for whoever attaches next."""
    max_kept: int = 1000
    """Consoles one replica keeps at most, shared fairly between namespaces (logged past it)."""
    max_kept_per_namespace: int = 100
    """Consoles of one namespace kept at most, however many opt in."""
    recordings: str = ""
    """Directory recordings are written to; empty: nothing is recorded."""
    max_recording_bytes: int = 64 << 20
    """Size of one recording file before it goes on in a new one."""
    max_recordings_bytes: int = 1 << 30
    """Size of all recordings together; past it nothing more is recorded (nothing is deleted
    to make room across namespaces)."""
    max_namespace_bytes: int = 256 << 20
    """Size of one namespace's recordings; past 90 % of it that namespace's oldest recordings
    not recorded `always` or `required` are deleted, at 100 % its recorded consoles and
    displays refuse sessions."""
    max_age: float = 0.0
    """Seconds after its last write that a recording is deleted, audit or not; 0: never."""
    display_rate: float = 4.0
    """Framebuffer updates a display's recording asks for per second, at most."""


@dataclass(frozen=True)
class Config:
    """Everything the configuration file says."""

    group: str = "subresources.subres.dev"
    version: str = "v1alpha1"
    parents: tuple[ParentSpec, ...] = field(default_factory=lambda: (_default_parent(),))
    policy: EndpointPolicySpec = EndpointPolicySpec()
    session: SessionSpec = SessionSpec()
    server_version: Mapping[str, str] = field(default_factory=dict)
    """Fields of the `…/{version}/version` document that replace subres's own (KubeVirt's
    clients compare `gitVersion` with theirs)."""
    endpoints_from_spec: bool = False
    """Opt-in: backends may be read from outside `.status` (`.spec`, annotations), which
    anyone who may edit a parent object can change. Off, endpoints come from `.status`,
    written through the status subresource that namespace editors do not get."""
    consoles: ConsolesSpec = ConsolesSpec()
    limits: tuple[LimitRule, ...] = ()
    """Per-role limits (`policies.LimitRule`): the strictest that matches a session wins."""
    moderation: tuple[Moderation, ...] = ()
    """Which sessions need moderators watching (`policies.Moderation`); the first that
    matches applies."""

    def parent(self, resource: str) -> ParentSpec | None:
        """The parent kind served under `resource`."""
        return next((p for p in self.parents if p.resource == resource), None)


TRUSTED_PREFIX = ".status."
"""Where endpoint field paths must point unless `endpointsFromSpec` is set."""
TRUSTED_FIELDS = (".metadata.name", ".metadata.namespace", ".metadata.uid")
"""Fields outside `.status` a backend may still be built from: the object's identity."""


def _default_parent(root: str = ".status") -> ParentSpec:
    running = (Requirement(".status.phase", ("Running",)),)
    vnc = f"{root}.vnc.endpoint"
    subs = {
        "console": SubresourceSpec(
            "console", endpoint=f"{root}.console.endpoint", requires=running, label=DEFAULT_CONSOLE
        ),
        "vnc": SubresourceSpec("vnc", endpoint=vnc, requires=running),
        "screenshot": SubresourceSpec("screenshot", endpoint=vnc, requires=running),
        "portforward": SubresourceSpec(
            "portforward",
            address=f"{root}.portForward.address",
            ports=f"{root}.portForward.ports",
            requires=running,
        ),
        "usbredir": SubresourceSpec(
            "usbredir", endpoint=f"{root}.usbredir.endpoints", requires=running, slots=USB_SLOTS
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
    """The value at a field path (`fields.path` grammar), or None when any step is missing."""
    return fields.path(path).get(obj)


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
    keys = {
        "group",
        "version",
        "parents",
        "endpointPolicy",
        "session",
        "serverVersion",
        "endpointsFromSpec",
        "consoles",
        "limits",
        "moderation",
    }
    doc = _mapping(data, "config", keys)
    default = Config()
    from_spec = _bool(doc.get("endpointsFromSpec", False), "endpointsFromSpec")
    parents = doc.get("parents")
    cfg = Config(
        group=_name(doc.get("group", default.group), "group", _SUBDOMAIN),
        version=_name(doc.get("version", default.version), "version", _LABEL),
        parents=tuple(_parent(p) for p in _list(parents, "parents"))
        if parents is not None
        else (_default_parent(".spec" if from_spec else ".status"),),
        policy=_policy(doc.get("endpointPolicy", {})),
        session=_session(doc.get("session", {})),
        server_version=_server_version(doc.get("serverVersion", {})),
        endpoints_from_spec=from_spec,
        consoles=_consoles(doc.get("consoles", {})),
        **_policies(doc),
    )
    resources = [p.resource for p in cfg.parents]
    if not resources or len(set(resources)) != len(resources):
        raise ConfigError("parents must name at least one resource, each once")
    for parent in cfg.parents:
        if parent.instance is not None and cfg.parent(parent.instance.resource) in (None, parent):
            raise ConfigError(
                f"{parent.resource}.instance.resource: {parent.instance.resource!r} "
                "must be another parent of this file"
            )
    if not from_spec:
        _check_trusted(cfg.parents)
    return cfg


def _policies(doc: Mapping[str, Any]) -> dict[str, Any]:
    """`limits` and `moderation`, read by `policies`."""
    try:
        return {
            "limits": policies.parse_limits(doc.get("limits", [])),
            "moderation": policies.parse_moderation(doc.get("moderation", [])),
        }
    except policies.PolicyError as exc:
        raise ConfigError(str(exc)) from None


def _check_trusted(parents: tuple[ParentSpec, ...]) -> None:
    """Refuse backends read from fields an editor of the object can write, unless the
    file opted in: every field an endpoint, address, port list or SSH setting reads
    (directly or in a template) must be under `.status`, or be the object's name,
    namespace or uid (which a template may use to pick a socket of its own)."""
    for parent in parents:
        # The node picks the agent that dials, so an editor must not choose it either.
        if parent.node and not parent.node.startswith(TRUSTED_PREFIX):
            raise ConfigError(
                f"{parent.resource}.node reads {parent.node}, which whoever may edit the "
                "object can change; use a .status field, or set endpointsFromSpec: true"
            )
        for sub in (*parent.subresources.values(), *parent.all_consoles()):
            for source in _backend_sources(sub):
                for path in _fields_of(source):
                    if not path.startswith(TRUSTED_PREFIX) and path not in TRUSTED_FIELDS:
                        what = f"{parent.resource}.{sub.name}{_which(sub)}"
                        raise ConfigError(
                            f"{what} reads its backend from {path}, "
                            "which whoever may edit the object can change; use a .status "
                            "field, or set endpointsFromSpec: true to let editors choose "
                            "where subres dials"
                        )


def _which(sub: SubresourceSpec) -> str:
    return f" {sub.unit}" if sub.unit else ""


def _backend_sources(sub: SubresourceSpec) -> list[str]:
    sources = [
        slot_source(sub.endpoint, 0),
        sub.address,
        "" if sub.ports == ANY_PORT else sub.ports,
    ]
    if sub.ssh is not None:
        ssh = sub.ssh
        sources += [ssh.credentials, ssh.host_key, ssh.command, ssh.via]
    return [text for text in sources if text]


def _fields_of(text: str) -> list[str]:
    """The field paths a configured value reads: itself, or a template's placeholders."""
    if text[:1] in (".", "["):
        return [text]
    if "{" not in text:
        return []  # a literal (an SSH command without placeholders)
    return [str(p) for p in fields.template(text).parts if isinstance(p, fields.FieldPath)]


def _parent(data: Any) -> ParentSpec:
    keys = {"resource", "singular", "kind", "source", "subresources", "instance", "node"}
    doc = _mapping(data, "parent", keys)
    resource = _name(doc.get("resource"), "parent.resource", _LABEL)
    source = _mapping(doc.get("source"), f"{resource}.source", {"group", "version", "resource"})
    subs = _mapping(doc.get("subresources"), f"{resource}.subresources", set(SUBRESOURCES))
    return ParentSpec(
        resource=resource,
        singular=_name(doc.get("singular", resource.rstrip("s")), f"{resource}.singular", _LABEL),
        kind=_name(doc.get("kind"), f"{resource}.kind", _KIND),
        group=_name(source.get("group"), f"{resource}.source.group", _SUBDOMAIN),
        version=_name(source.get("version"), f"{resource}.source.version", _LABEL),
        crd_resource=_name(source.get("resource", resource), f"{resource}.source.resource", _LABEL),
        subresources={
            name: _console(spec) if name == "console" else _subresource(name, spec)
            for name, spec in subs.items()
        },
        instance=_instance(doc["instance"], f"{resource}.instance") if "instance" in doc else None,
        node=_str(doc.get("node", ParentSpec.node), f"{resource}.node"),
    )


def _instance(data: Any, what: str) -> InstanceSpec:
    doc = _mapping(data, what, {"resource", "require"})
    return InstanceSpec(
        resource=_str(doc.get("resource"), f"{what}.resource"),
        requires=_requirements(doc.get("require", {}), f"{what}.require"),
    )


def slot_source(endpoint: str, slot: int) -> str:
    """A usbredir endpoint's field path or template, for slot number `slot`."""
    return endpoint.replace(SLOT, str(slot))


def _subresource(name: str, data: Any) -> SubresourceSpec:
    keys = {"endpoint", "address", "ports", "require", "ssh", "nodeLocal", "keep", "record"}
    doc = _mapping(data, name, keys | {"slots", "name", "consoles"})
    if ("name" in doc or "consoles" in doc) and name != "console":
        raise ConfigError(f"{name}: only console has a name and more consoles")
    if "keep" in doc and (name != "console" or doc["keep"] not in OPT_IN):
        raise ConfigError(f"{name}.keep: only console has it, one of {', '.join(OPT_IN)}")
    if "record" in doc and (name not in RECORDED or doc["record"] not in RECORD):
        raise ConfigError(
            f"{name}.record: only console and vnc have it, one of {', '.join(RECORD)}"
        )
    if "slots" in doc and name != "usbredir":
        raise ConfigError(f"{name}.slots: only usbredir has slots")
    if SLOT in str(doc.get("endpoint", "")) and name != "usbredir":
        raise ConfigError(f"{name}.endpoint: only usbredir endpoints have a {SLOT}")
    if name == "portforward":
        if "address" not in doc or "ports" not in doc:
            raise ConfigError("portforward needs `address` and `ports` field paths")
    elif "endpoint" not in doc:
        raise ConfigError(f"{name} needs an `endpoint` field path or template")
    ports = _str(doc.get("ports", ""), f"{name}.ports")
    node_local = doc.get("nodeLocal", False)
    if not isinstance(node_local, bool):
        raise ConfigError(f"{name}.nodeLocal must be true or false")
    endpoint = doc.get("endpoint")
    _source(slot_source(endpoint, 0) if isinstance(endpoint, str) else endpoint, f"{name}.endpoint")
    return SubresourceSpec(
        name=name,
        endpoint=endpoint or "",
        address=_path(doc.get("address"), f"{name}.address"),
        ports=ports if ports == ANY_PORT else _path(ports or None, f"{name}.ports"),
        requires=_requirements(doc.get("require", {}), f"{name}.require"),
        ssh=_ssh(name, doc["ssh"]) if "ssh" in doc else None,
        node_local=node_local,
        keep=doc.get("keep", "annotated"),
        record=doc.get("record", "annotated"),
        slots=_count(doc.get("slots", USB_SLOTS), f"{name}.slots") if name == "usbredir" else 0,
        label=_name(doc.get("name", DEFAULT_CONSOLE), f"{name}.name", _LABEL)
        if name == "console"
        else "",
    )


def _console(data: Any) -> SubresourceSpec:
    """The default console, with the other consoles named under its `consoles:`."""
    doc = _mapping(data, "console", None)
    console = _subresource("console", {k: v for k, v in doc.items() if k != "consoles"})
    others = _mapping(doc.get("consoles", {}), "console.consoles", None)
    if len(others) + 1 > MAX_CONSOLES:
        raise ConfigError(f"console.consoles: at most {MAX_CONSOLES} consoles in all")
    specs = []
    for label, spec in others.items():
        what = f"console.consoles.{label}"
        _name(label, what, _LABEL)
        if label == console.label:
            raise ConfigError(f"{what}: the default console is called {label} already")
        fields_ = _mapping(
            spec, what, {"endpoint", "require", "ssh", "nodeLocal", "keep", "record"}
        )
        # A console says what differs; the rest (state rules, nodeLocal) is the default's.
        inherited = {"require": doc.get("require", {}), "nodeLocal": doc.get("nodeLocal", False)}
        other = _subresource("console", {**inherited, **fields_, "name": label})
        specs.append(dataclasses.replace(other, unit=label))
    return dataclasses.replace(console, consoles=tuple(specs))


def _ssh(name: str, data: Any) -> SshSpec:
    what = f"{name}.ssh"
    doc = _mapping(data, what, {"credentials", "hostKey", "command", "term", "via"})
    if "credentials" not in doc:
        raise ConfigError(f"{what} needs `credentials`: the field path of a Secret's name")
    if "via" in doc and name != "portforward":
        raise ConfigError(f"{what}.via is for portforward only")
    if ("command" in doc or "term" in doc) and name != "console":
        raise ConfigError(f"{what}: command and term are for console only")
    command = _str(doc.get("command", ""), f"{what}.command")
    if "{" in command or "}" in command:
        try:
            fields.template(command)
        except fields.FieldError as exc:
            raise ConfigError(f"{what}.command: {exc}") from None
    return SshSpec(
        credentials=_path(doc["credentials"], f"{what}.credentials"),
        host_key=_path(doc.get("hostKey"), f"{what}.hostKey"),
        command=command,
        term=_str(doc.get("term", SshSpec.term), f"{what}.term"),
        via=_source(doc.get("via"), f"{what}.via"),
    )


def _requirements(data: Any, what: str) -> tuple[Requirement, ...]:
    """Rules as a list of `{field, in | notIn, code, message}`, or the short mapping form
    `{.status.phase: [Running]}` (`in`, code 409)."""
    if isinstance(data, dict):
        return tuple(
            Requirement(_path(path, what), _scalars(values, f"{what}.{path}"))
            for path, values in data.items()
        )
    return tuple(_rule(item, f"{what}[{i}]") for i, item in enumerate(_list(data, what)))


def _rule(data: Any, what: str) -> Requirement:
    doc = _mapping(data, what, {"field", "in", "notIn", "code", "message"})
    if ("in" in doc) == ("notIn" in doc):
        raise ConfigError(f"{what}: give exactly one of `in` and `notIn`")
    code = doc.get("code", 409)
    if isinstance(code, bool) or not isinstance(code, int) or not 400 <= code <= 599:
        raise ConfigError(f"{what}.code must be an HTTP error code (400-599)")
    return Requirement(
        path=_path(doc.get("field"), f"{what}.field"),
        values=_scalars(doc.get("in", doc.get("notIn")), what),
        negate="notIn" in doc,
        code=code,
        message=_str(doc.get("message", ""), f"{what}.message"),
    )


def _scalars(data: Any, what: str) -> tuple[Scalar, ...]:
    values = _list(data, what)
    for value in values:
        if value is not None and not isinstance(value, str | int | float | bool):
            raise ConfigError(f"{what}: {value!r} is not a string, number, boolean or null")
    return tuple(values)


def _path(data: Any, what: str) -> str:
    """A field path, checked now so a typo fails at start instead of on a request."""
    if data is None:
        return ""
    try:
        return fields.path(_str(data, what)).text
    except fields.FieldError as exc:
        raise ConfigError(f"{what}: {exc}") from None


def _source(data: Any, what: str) -> str:
    """A field path (`.a.b`) or a template with `{.a.b}` placeholders, checked now."""
    if data is None:
        return ""
    text = _str(data, what)
    try:
        fields.value_source(text)
    except fields.FieldError as exc:
        raise ConfigError(f"{what}: {exc}") from None
    return text


def _server_version(data: Any) -> dict[str, str]:
    keys = {"gitVersion", "gitCommit", "gitTreeState", "buildDate", "goVersion", "compiler"}
    doc = _mapping(data, "serverVersion", keys | {"platform"})
    return {key: _str(value, f"serverVersion.{key}") for key, value in doc.items()}


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
        "relayHeartbeat",
        "connectTimeout",
        "readSize",
        "maxMessage",
        "screenshotTimeout",
        "backendWriteTimeout",
        "sshIdleTimeout",
        "screenshotMaxPixels",
        "screenshotConcurrency",
        "observerBacklog",
        "maxObservers",
        "maxObserversPerConsole",
    }
    doc = _mapping(data, "session", keys)
    default = SessionSpec()
    return SessionSpec(
        ping_interval=_positive(doc.get("pingInterval", default.ping_interval), "pingInterval"),
        relay_heartbeat=_heartbeat(doc.get("relayHeartbeat", default.relay_heartbeat)),
        connect_timeout=_positive(
            doc.get("connectTimeout", default.connect_timeout), "connectTimeout"
        ),
        read_size=_count(doc.get("readSize", default.read_size), "readSize"),
        max_message=_count(doc.get("maxMessage", default.max_message), "maxMessage"),
        screenshot_timeout=_positive(
            doc.get("screenshotTimeout", default.screenshot_timeout), "screenshotTimeout"
        ),
        backend_write_timeout=_positive(
            doc.get("backendWriteTimeout", default.backend_write_timeout), "backendWriteTimeout"
        ),
        ssh_idle_timeout=_positive(
            doc.get("sshIdleTimeout", default.ssh_idle_timeout), "sshIdleTimeout"
        ),
        screenshot_max_pixels=_count(
            doc.get("screenshotMaxPixels", default.screenshot_max_pixels), "screenshotMaxPixels"
        ),
        screenshot_concurrency=_count(
            doc.get("screenshotConcurrency", default.screenshot_concurrency),
            "screenshotConcurrency",
        ),
        observer_backlog=_count(
            doc.get("observerBacklog", default.observer_backlog), "observerBacklog"
        ),
        max_observers=_count(doc.get("maxObservers", default.max_observers), "maxObservers"),
        max_observers_per_console=_count(
            doc.get("maxObserversPerConsole", default.max_observers_per_console),
            "maxObserversPerConsole",
        ),
    )


def _consoles(data: Any) -> ConsolesSpec:
    keys = {
        "keepAnnotation",
        "recordAnnotation",
        "recordDisplayAnnotation",
        "scrollback",
        "maxKept",
        "maxKeptPerNamespace",
        "recordings",
    }
    doc = _mapping(data, "consoles", keys)
    files = _mapping(
        doc.get("recordings", {}),
        "consoles.recordings",
        {
            "directory",
            "maxFileBytes",
            "maxTotalBytes",
            "maxNamespaceBytes",
            "maxAge",
            "displayRate",
        },
    )
    d = ConsolesSpec()

    def size(value: Any, what: str) -> int:
        return _count(value, f"consoles.{what}")

    return ConsolesSpec(
        keep_annotation=_str(doc.get("keepAnnotation", d.keep_annotation), "keepAnnotation"),
        record_annotation=_str(
            doc.get("recordAnnotation", d.record_annotation), "recordAnnotation"
        ),
        record_display_annotation=_str(
            doc.get("recordDisplayAnnotation", d.record_display_annotation),
            "recordDisplayAnnotation",
        ),
        scrollback=size(doc.get("scrollback", d.scrollback), "scrollback"),
        max_kept=size(doc.get("maxKept", d.max_kept), "maxKept"),
        max_kept_per_namespace=size(
            doc.get("maxKeptPerNamespace", d.max_kept_per_namespace), "maxKeptPerNamespace"
        ),
        recordings=_str(files.get("directory", d.recordings), "recordings.directory"),
        max_recording_bytes=size(
            files.get("maxFileBytes", d.max_recording_bytes), "recordings.maxFileBytes"
        ),
        max_recordings_bytes=size(
            files.get("maxTotalBytes", d.max_recordings_bytes), "recordings.maxTotalBytes"
        ),
        max_namespace_bytes=size(
            files.get("maxNamespaceBytes", d.max_namespace_bytes), "recordings.maxNamespaceBytes"
        ),
        max_age=_positive(files["maxAge"], "consoles.recordings.maxAge")
        if "maxAge" in files
        else d.max_age,
        display_rate=_positive(
            files.get("displayRate", d.display_rate), "consoles.recordings.displayRate"
        ),
    )


def _count(data: Any, what: str) -> int:
    if isinstance(data, bool) or not isinstance(data, int) or data <= 0:
        raise ConfigError(f"{what} must be a positive integer")
    return data


def _mapping(data: Any, what: str, keys: set[str] | None) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ConfigError(f"{what} must be a mapping")
    unknown = set(data) - keys if keys is not None else set()
    if unknown:
        raise ConfigError(f"{what}: unknown keys {sorted(map(str, unknown))}")
    return data


def _list(data: Any, what: str) -> list[Any]:
    if not isinstance(data, list | tuple):
        raise ConfigError(f"{what} must be a list")
    return list(data)


def _str(data: Any, what: str) -> str:
    if not isinstance(data, str):
        raise ConfigError(f"{what} must be a string")
    return data


_DNS_LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
_LABEL = re.compile(_DNS_LABEL)
_SUBDOMAIN = re.compile(rf"(?=.{{1,253}}$){_DNS_LABEL}(\.{_DNS_LABEL})*")
_KIND = re.compile(r"[A-Z][A-Za-z0-9]{0,62}")


def _name(data: Any, what: str, pattern: re.Pattern[str]) -> str:
    """A name that goes into API paths: a DNS label or subdomain, or a kind."""
    text = _str(data, what)
    if not pattern.fullmatch(text):
        raise ConfigError(f"{what}: {text[:64]!r} is not a valid name here")
    return text


def _bool(data: Any, what: str) -> bool:
    if not isinstance(data, bool):
        raise ConfigError(f"{what} must be true or false")
    return data


def _heartbeat(data: Any) -> float:
    seconds = _positive(data, "relayHeartbeat")
    if relay.heartbeat_interval(str(seconds)) is None:
        raise ConfigError(
            f"relayHeartbeat must be {relay.MIN_HEARTBEAT:g} to {relay.MAX_HEARTBEAT:g} seconds"
        )
    return seconds


def _positive(data: Any, what: str) -> float:
    if isinstance(data, bool) or not isinstance(data, int | float) or data <= 0:
        raise ConfigError(f"{what} must be a positive number")
    return float(data)
