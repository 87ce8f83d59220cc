"""The configuration file (`--config`) read and validated into `subres.config.model`.

No other module parses YAML: a mistake in the file is a `ConfigError` naming
where it is, raised before anything serves.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from subres import fields, policies
from subres.config import shapes
from subres.config.model import (
    ANY_PORT,
    DEFAULT_CONSOLE,
    MAX_CONSOLES,
    OPT_IN,
    RECORD,
    RECORDED,
    SLOT,
    SUBRESOURCES,
    TRUSTED_FIELDS,
    TRUSTED_PREFIX,
    USB_SLOTS,
    Config,
    ConsolesSpec,
    EndpointPolicySpec,
    InstanceSpec,
    IpmiSpec,
    ParentSpec,
    Requirement,
    Scalar,
    SessionSpec,
    SshSpec,
    SubresourceSpec,
    default_parent,
)
from subres.config.shapes import ConfigError
from subres.protocol import relay

__all__ = ["load", "parse", "slot_source"]


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
    doc = shapes.mapping(data, "config", keys)
    default = Config()
    from_spec = shapes.boolean(doc.get("endpointsFromSpec", False), "endpointsFromSpec")
    parents = doc.get("parents")
    cfg = Config(
        group=shapes.name(doc.get("group", default.group), "group", shapes.SUBDOMAIN),
        version=shapes.name(doc.get("version", default.version), "version", shapes.LABEL),
        parents=tuple(_parent(p) for p in shapes.sequence(parents, "parents"))
        if parents is not None
        else (default_parent(".spec" if from_spec else ".status"),),
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
    if sub.ipmi is not None:
        sources.append(sub.ipmi.credentials)
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
    doc = shapes.mapping(data, "parent", keys)
    resource = shapes.name(doc.get("resource"), "parent.resource", shapes.LABEL)
    source = shapes.mapping(
        doc.get("source"), f"{resource}.source", {"group", "version", "resource"}
    )
    subs = shapes.mapping(doc.get("subresources"), f"{resource}.subresources", set(SUBRESOURCES))
    return ParentSpec(
        resource=resource,
        singular=shapes.name(
            doc.get("singular", resource.rstrip("s")), f"{resource}.singular", shapes.LABEL
        ),
        kind=shapes.name(doc.get("kind"), f"{resource}.kind", shapes.KIND),
        group=shapes.name(source.get("group"), f"{resource}.source.group", shapes.SUBDOMAIN),
        version=shapes.name(source.get("version"), f"{resource}.source.version", shapes.LABEL),
        crd_resource=shapes.name(
            source.get("resource", resource), f"{resource}.source.resource", shapes.LABEL
        ),
        subresources={
            name: _console(spec) if name == "console" else _subresource(name, spec)
            for name, spec in subs.items()
        },
        instance=_instance(doc["instance"], f"{resource}.instance") if "instance" in doc else None,
        node=shapes.text(doc.get("node", ParentSpec.node), f"{resource}.node"),
    )


def _instance(data: Any, what: str) -> InstanceSpec:
    doc = shapes.mapping(data, what, {"resource", "require"})
    return InstanceSpec(
        resource=shapes.text(doc.get("resource"), f"{what}.resource"),
        requires=_requirements(doc.get("require", {}), f"{what}.require"),
    )


def slot_source(endpoint: str, slot: int) -> str:
    """A usbredir endpoint's field path or template, for slot number `slot`."""
    return endpoint.replace(SLOT, str(slot))


def _subresource(name: str, data: Any) -> SubresourceSpec:
    keys = {"endpoint", "address", "ports", "require", "ssh", "ipmi", "nodeLocal", "keep", "record"}
    doc = shapes.mapping(data, name, keys | {"slots", "name", "consoles"})
    if ("name" in doc or "consoles" in doc) and name != "console":
        raise ConfigError(f"{name}: only console has a name and more consoles")
    if "keep" in doc and (name != "console" or doc["keep"] not in OPT_IN):
        raise ConfigError(f"{name}.keep: only console has it, one of {', '.join(OPT_IN)}")
    if "record" in doc and (name not in RECORDED or doc["record"] not in RECORD):
        raise ConfigError(
            f"{name}.record: only console and vnc have it, one of {', '.join(RECORD)}"
        )
    if "ipmi" in doc and name != "console":
        raise ConfigError(f"{name}.ipmi: only a console can be IPMI Serial-over-LAN")
    if "slots" in doc and name != "usbredir":
        raise ConfigError(f"{name}.slots: only usbredir has slots")
    if SLOT in str(doc.get("endpoint", "")) and name != "usbredir":
        raise ConfigError(f"{name}.endpoint: only usbredir endpoints have a {SLOT}")
    if name == "portforward":
        if "address" not in doc or "ports" not in doc:
            raise ConfigError("portforward needs `address` and `ports` field paths")
    elif "endpoint" not in doc:
        raise ConfigError(f"{name} needs an `endpoint` field path or template")
    ports = shapes.text(doc.get("ports", ""), f"{name}.ports")
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
        ipmi=_ipmi(name, doc["ipmi"]) if "ipmi" in doc else None,
        node_local=node_local,
        keep=doc.get("keep", "annotated"),
        record=doc.get("record", "annotated"),
        slots=shapes.count(doc.get("slots", USB_SLOTS), f"{name}.slots")
        if name == "usbredir"
        else 0,
        label=shapes.name(doc.get("name", DEFAULT_CONSOLE), f"{name}.name", shapes.LABEL)
        if name == "console"
        else "",
    )


def _console(data: Any) -> SubresourceSpec:
    """The default console, with the other consoles named under its `consoles:`."""
    doc = shapes.mapping(data, "console", None)
    console = _subresource("console", {k: v for k, v in doc.items() if k != "consoles"})
    others = shapes.mapping(doc.get("consoles", {}), "console.consoles", None)
    if len(others) + 1 > MAX_CONSOLES:
        raise ConfigError(f"console.consoles: at most {MAX_CONSOLES} consoles in all")
    specs = []
    for label, spec in others.items():
        what = f"console.consoles.{label}"
        shapes.name(label, what, shapes.LABEL)
        if label == console.label:
            raise ConfigError(f"{what}: the default console is called {label} already")
        fields_ = shapes.mapping(
            spec, what, {"endpoint", "require", "ssh", "ipmi", "nodeLocal", "keep", "record"}
        )
        # A console says what differs; the rest (state rules, nodeLocal) is the default's.
        inherited = {"require": doc.get("require", {}), "nodeLocal": doc.get("nodeLocal", False)}
        other = _subresource("console", {**inherited, **fields_, "name": label})
        specs.append(dataclasses.replace(other, unit=label))
    return dataclasses.replace(console, consoles=tuple(specs))


def _ssh(name: str, data: Any) -> SshSpec:
    what = f"{name}.ssh"
    doc = shapes.mapping(data, what, {"credentials", "hostKey", "command", "term", "via"})
    if "credentials" not in doc:
        raise ConfigError(f"{what} needs `credentials`: the field path of a Secret's name")
    if "via" in doc and name != "portforward":
        raise ConfigError(f"{what}.via is for portforward only")
    if ("command" in doc or "term" in doc) and name != "console":
        raise ConfigError(f"{what}: command and term are for console only")
    command = shapes.text(doc.get("command", ""), f"{what}.command")
    if "{" in command or "}" in command:
        try:
            fields.template(command)
        except fields.FieldError as exc:
            raise ConfigError(f"{what}.command: {exc}") from None
    return SshSpec(
        credentials=_path(doc["credentials"], f"{what}.credentials"),
        host_key=_path(doc.get("hostKey"), f"{what}.hostKey"),
        command=command,
        term=shapes.text(doc.get("term", SshSpec.term), f"{what}.term"),
        via=_source(doc.get("via"), f"{what}.via"),
    )


IPMI_PRIVILEGES = ("user", "operator", "administrator")
IPMI_SUITES = (0, 1, 2, 3)


def _ipmi(name: str, data: Any) -> IpmiSpec:
    what = f"{name}.ipmi"
    keys = {"credentials", "privilege", "cipherSuite", "allowCipherSuiteZero", "takeover"}
    doc = shapes.mapping(data, what, keys)
    if "credentials" not in doc:
        raise ConfigError(f"{what} needs `credentials`: the field path of a Secret's name")
    privilege = doc.get("privilege", IpmiSpec.privilege)
    if privilege not in IPMI_PRIVILEGES:
        raise ConfigError(f"{what}.privilege must be one of {', '.join(IPMI_PRIVILEGES)}")
    suite = doc.get("cipherSuite", IpmiSpec.cipher_suite)
    if isinstance(suite, bool) or suite not in IPMI_SUITES:
        raise ConfigError(
            f"{what}.cipherSuite must be one of 1, 2, 3 (0 with allowCipherSuiteZero)"
        )
    allow_zero = shapes.boolean(
        doc.get("allowCipherSuiteZero", False), f"{what}.allowCipherSuiteZero"
    )
    if suite == 0 and not allow_zero:
        raise ConfigError(f"{what}.cipherSuite 0 has no security at all: set allowCipherSuiteZero")
    return IpmiSpec(
        credentials=_path(doc["credentials"], f"{what}.credentials"),
        privilege=privilege,
        cipher_suite=suite,
        allow_cipher_suite_zero=allow_zero,
        takeover=shapes.boolean(doc.get("takeover", False), f"{what}.takeover"),
    )


def _requirements(data: Any, what: str) -> tuple[Requirement, ...]:
    """Rules as a list of `{field, in | notIn, code, message}`, or the short mapping form
    `{.status.phase: [Running]}` (`in`, code 409)."""
    if isinstance(data, dict):
        return tuple(
            Requirement(_path(path, what), _scalars(values, f"{what}.{path}"))
            for path, values in data.items()
        )
    return tuple(_rule(item, f"{what}[{i}]") for i, item in enumerate(shapes.sequence(data, what)))


def _rule(data: Any, what: str) -> Requirement:
    doc = shapes.mapping(data, what, {"field", "in", "notIn", "code", "message"})
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
        message=shapes.text(doc.get("message", ""), f"{what}.message"),
    )


def _scalars(data: Any, what: str) -> tuple[Scalar, ...]:
    values = shapes.sequence(data, what)
    for value in values:
        if value is not None and not isinstance(value, str | int | float | bool):
            raise ConfigError(f"{what}: {value!r} is not a string, number, boolean or null")
    return tuple(values)


def _path(data: Any, what: str) -> str:
    """A field path, checked now so a typo fails at start instead of on a request."""
    if data is None:
        return ""
    try:
        return fields.path(shapes.text(data, what)).text
    except fields.FieldError as exc:
        raise ConfigError(f"{what}: {exc}") from None


def _source(data: Any, what: str) -> str:
    """A field path (`.a.b`) or a template with `{.a.b}` placeholders, checked now."""
    if data is None:
        return ""
    text = shapes.text(data, what)
    try:
        fields.value_source(text)
    except fields.FieldError as exc:
        raise ConfigError(f"{what}: {exc}") from None
    return text


def _server_version(data: Any) -> dict[str, str]:
    keys = {"gitVersion", "gitCommit", "gitTreeState", "buildDate", "goVersion", "compiler"}
    doc = shapes.mapping(data, "serverVersion", keys | {"platform"})
    return {key: shapes.text(value, f"serverVersion.{key}") for key, value in doc.items()}


def _policy(data: Any) -> EndpointPolicySpec:
    keys = {"schemes", "allowCIDRs", "denyCIDRs", "socketDirs"}
    doc = shapes.mapping(data, "endpointPolicy", keys)
    default = EndpointPolicySpec()
    return EndpointPolicySpec(
        schemes=tuple(
            shapes.text(s, "schemes")
            for s in shapes.sequence(doc.get("schemes", default.schemes), "")
        ),
        allow_cidrs=_networks(doc.get("allowCIDRs"), default.allow_cidrs),
        deny_cidrs=_networks(doc.get("denyCIDRs"), default.deny_cidrs),
        socket_dirs=tuple(
            shapes.text(d, "socketDirs")
            for d in shapes.sequence(doc.get("socketDirs", default.socket_dirs), "")
        ),
    )


def _networks(
    data: Any, default: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]
) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    if data is None:
        return default
    try:
        return tuple(
            ipaddress.ip_network(shapes.text(c, "CIDR")) for c in shapes.sequence(data, "CIDRs")
        )
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
    doc = shapes.mapping(data, "session", keys)
    default = SessionSpec()
    return SessionSpec(
        ping_interval=shapes.positive(
            doc.get("pingInterval", default.ping_interval), "pingInterval"
        ),
        relay_heartbeat=_heartbeat(doc.get("relayHeartbeat", default.relay_heartbeat)),
        connect_timeout=shapes.positive(
            doc.get("connectTimeout", default.connect_timeout), "connectTimeout"
        ),
        read_size=shapes.count(doc.get("readSize", default.read_size), "readSize"),
        max_message=shapes.count(doc.get("maxMessage", default.max_message), "maxMessage"),
        screenshot_timeout=shapes.positive(
            doc.get("screenshotTimeout", default.screenshot_timeout), "screenshotTimeout"
        ),
        backend_write_timeout=shapes.positive(
            doc.get("backendWriteTimeout", default.backend_write_timeout), "backendWriteTimeout"
        ),
        ssh_idle_timeout=shapes.positive(
            doc.get("sshIdleTimeout", default.ssh_idle_timeout), "sshIdleTimeout"
        ),
        screenshot_max_pixels=shapes.count(
            doc.get("screenshotMaxPixels", default.screenshot_max_pixels), "screenshotMaxPixels"
        ),
        screenshot_concurrency=shapes.count(
            doc.get("screenshotConcurrency", default.screenshot_concurrency),
            "screenshotConcurrency",
        ),
        observer_backlog=shapes.count(
            doc.get("observerBacklog", default.observer_backlog), "observerBacklog"
        ),
        max_observers=shapes.count(doc.get("maxObservers", default.max_observers), "maxObservers"),
        max_observers_per_console=shapes.count(
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
    doc = shapes.mapping(data, "consoles", keys)
    files = shapes.mapping(
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
        return shapes.count(value, f"consoles.{what}")

    return ConsolesSpec(
        keep_annotation=shapes.text(doc.get("keepAnnotation", d.keep_annotation), "keepAnnotation"),
        record_annotation=shapes.text(
            doc.get("recordAnnotation", d.record_annotation), "recordAnnotation"
        ),
        record_display_annotation=shapes.text(
            doc.get("recordDisplayAnnotation", d.record_display_annotation),
            "recordDisplayAnnotation",
        ),
        scrollback=size(doc.get("scrollback", d.scrollback), "scrollback"),
        max_kept=size(doc.get("maxKept", d.max_kept), "maxKept"),
        max_kept_per_namespace=size(
            doc.get("maxKeptPerNamespace", d.max_kept_per_namespace), "maxKeptPerNamespace"
        ),
        recordings=shapes.text(files.get("directory", d.recordings), "recordings.directory"),
        max_recording_bytes=size(
            files.get("maxFileBytes", d.max_recording_bytes), "recordings.maxFileBytes"
        ),
        max_recordings_bytes=size(
            files.get("maxTotalBytes", d.max_recordings_bytes), "recordings.maxTotalBytes"
        ),
        max_namespace_bytes=size(
            files.get("maxNamespaceBytes", d.max_namespace_bytes), "recordings.maxNamespaceBytes"
        ),
        max_age=shapes.positive(files["maxAge"], "consoles.recordings.maxAge")
        if "maxAge" in files
        else d.max_age,
        display_rate=shapes.positive(
            files.get("displayRate", d.display_rate), "consoles.recordings.displayRate"
        ),
    )


def _heartbeat(data: Any) -> float:
    seconds = shapes.positive(data, "relayHeartbeat")
    if relay.heartbeat_interval(str(seconds)) is None:
        raise ConfigError(
            f"relayHeartbeat must be {relay.MIN_HEARTBEAT:g} to {relay.MAX_HEARTBEAT:g} seconds"
        )
    return seconds
