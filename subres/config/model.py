"""The configuration's typed settings and their defaults (the Machine CRD of DESIGN.md).

Every layer reads these frozen dataclasses; `subres.config.loader` builds
them from YAML, and a missing file means `Config()`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from subres import fields
from subres.policies import LimitRule, Moderation

__all__ = [
    "ANY_PORT",
    "DEFAULT_CONSOLE",
    "DEFAULT_DENY_CIDRS",
    "DEFAULT_SOCKET_DIR",
    "MAX_CONSOLES",
    "OPT_IN",
    "RECORD",
    "RECORDED",
    "SLOT",
    "SUBRESOURCES",
    "TRUSTED_FIELDS",
    "TRUSTED_PREFIX",
    "USB_SLOTS",
    "Config",
    "ConsolesSpec",
    "EndpointPolicySpec",
    "InstanceSpec",
    "IpmiSpec",
    "ParentSpec",
    "Requirement",
    "Scalar",
    "SessionSpec",
    "SshSpec",
    "SubresourceSpec",
    "default_parent",
    "field_value",
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
class IpmiSpec:
    """How a console logs in to a BMC for IPMI Serial-over-LAN: `ipmi://` endpoints."""

    credentials: str = ""
    """Field path of the name of the Secret (in the parent's namespace) with `username` and
    `password`."""
    privilege: str = "administrator"
    """Session privilege level (`user`, `operator`, `administrator`); an endpoint's
    `?privilege=` may lower or change it."""
    cipher_suite: int = 3
    """RMCP+ cipher suite (1, 2 or 3); an endpoint's `?cipherSuite=` may choose another."""
    allow_cipher_suite_zero: bool = False
    """Whether suite 0 (no authentication, integrity or encryption at all) may be used."""
    takeover: bool = False
    """SOL active on another BMC session is deactivated (and the audit line says so),
    instead of refusing the console with 409."""


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
    ipmi: IpmiSpec | None = None
    """console: IPMI login for `ipmi://` endpoints (Serial-over-LAN)."""
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
    parents: tuple[ParentSpec, ...] = field(default_factory=lambda: (default_parent(),))
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


def default_parent(root: str = ".status") -> ParentSpec:
    """The Machine CRD of DESIGN.md, its backends read under `root` (`.status` or `.spec`)."""
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
