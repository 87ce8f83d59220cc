"""The configuration file: defaults, a full file, and the errors a typo gets."""

from __future__ import annotations

import re

import pytest

from subres import config


def test_defaults_serve_machines() -> None:
    cfg = config.Config()
    assert (cfg.group, cfg.version) == ("subresources.subres.dev", "v1alpha1")
    machines = cfg.parent("machines")
    assert machines is not None and machines.api_version == "subres.dev/v1alpha1"
    assert set(machines.subresources) == set(config.SUBRESOURCES)
    assert machines.subresources["console"].endpoint == ".status.console.endpoint"
    forward = machines.subresources["portforward"]
    assert (forward.address, forward.ports) == (
        ".status.portForward.address",
        ".status.portForward.ports",
    )
    assert not cfg.endpoints_from_spec
    # Node-local: unix sockets of a Machine that names its node; tcp only when marked.
    assert machines.node == ".status.nodeName"
    assert not any(s.node_local for s in machines.subresources.values())


def test_full_file() -> None:
    cfg = config.parse(
        {
            "group": "consoles.example.com",
            "version": "v1",
            "parents": [
                {
                    "resource": "hosts",
                    "kind": "BareMetalHost",
                    "source": {"group": "metal3.io", "version": "v1alpha1"},
                    "node": ".status.consumerNode",
                    "subresources": {
                        "console": {
                            "endpoint": ".status.console",
                            "require": {".status.state": ["provisioned", "ready"]},
                            "nodeLocal": True,
                        }
                    },
                }
            ],
            "endpointPolicy": {"allowCIDRs": ["10.0.0.0/8"], "socketDirs": []},
            "session": {"pingInterval": 30, "connectTimeout": 2.5, "relayHeartbeat": 0.5},
        }
    )
    hosts = cfg.parent("hosts")
    assert hosts is not None and hosts.singular == "host" and hosts.crd_resource == "hosts"
    rule = hosts.subresources["console"].requires[0]
    assert rule == config.Requirement(".status.state", ("provisioned", "ready"))
    assert hosts.node == ".status.consumerNode" and hosts.subresources["console"].node_local
    assert cfg.session.ping_interval == 30 and cfg.session.read_size == 65536
    assert cfg.session.relay_heartbeat == 0.5
    assert cfg.policy.socket_dirs == ()


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ({"grup": "x"}, "unknown keys ['grup']"),
        # A YAML null key beside a string one (found by the fuzzer: sorting them raised).
        ({None: 1, "J": 2}, "unknown keys ['J', 'None']"),
        ({"session": {"pingInterval": 0}}, "pingInterval must be a positive number"),
        ({"session": {"relayHeartbeat": 0}}, "relayHeartbeat must be a positive number"),
        ({"session": {"relayHeartbeat": 600}}, "relayHeartbeat must be 0.1 to 60 seconds"),
        ({"session": {"screenshotConcurrency": 0}}, "screenshotConcurrency must be a positive"),
        ({"session": {"screenshotMaxPixels": True}}, "screenshotMaxPixels must be a positive"),
        ({"session": {"readSize": 1.5}}, "readSize must be a positive integer"),
        ({"session": {"observerBacklog": 0.5}}, "observerBacklog must be a positive integer"),
        ({"consoles": {"scrollback": True}}, "consoles.scrollback must be a positive integer"),
        ({"endpointPolicy": {"allowCIDRs": ["10.0.0.0/33"]}}, "bad CIDR"),
        (
            {"parents": [{"resource": "x", "kind": "X", "source": {}, "subresources": {}}]},
            "must be a string",
        ),
        (
            {
                "parents": [
                    {
                        "resource": "x",
                        "kind": "X",
                        "source": {"group": "g", "version": "v"},
                        "subresources": {"portforward": {"endpoint": ".a"}},
                    }
                ]
            },
            "portforward needs",
        ),
        (
            {
                "parents": [
                    {
                        "resource": "x",
                        "kind": "X",
                        "source": {"group": "g", "version": "v"},
                        "subresources": {"console": {"endpoint": ".a", "nodeLocal": "yes"}},
                    }
                ]
            },
            "console.nodeLocal must be true or false",
        ),
    ],
)
def test_errors_name_the_problem(data: object, words: str) -> None:
    with pytest.raises(config.ConfigError, match=words.replace("[", r"\[").replace("]", r"\]")):
        config.parse(data)


def test_field_value() -> None:
    obj = {"spec": {"console": {"endpoint": "tcp://a:1"}}, "status": None}
    assert config.field_value(obj, ".spec.console.endpoint") == "tcp://a:1"
    assert config.field_value(obj, ".status.phase") is None
    assert config.field_value(obj, ".spec.nothing.here") is None


def _kubevirt_like(**subresources: object) -> dict[str, object]:
    return {
        "parents": [
            {
                "resource": "virtualmachineinstances",
                "kind": "VirtualMachineInstance",
                "source": {"group": "kubevirt.io", "version": "v1"},
                "subresources": subresources,
            },
            {
                "resource": "virtualmachines",
                "kind": "VirtualMachine",
                "source": {"group": "kubevirt.io", "version": "v1"},
                "instance": {
                    "resource": "virtualmachineinstances",
                    "require": [{"field": ".status.created", "in": [True], "code": 409}],
                },
                "subresources": {"portforward": {"address": ".status.a", "ports": "any"}},
            },
        ]
    }


def test_state_rules_carry_their_own_codes_and_messages() -> None:
    cfg = config.parse(
        _kubevirt_like(
            console={
                "endpoint": "unix:///run/vms/{.metadata.uid}/serial",
                "require": [
                    {"field": ".status.phase", "notIn": ["Failed"], "code": 409},
                    {"field": ".status.phase", "in": ["Running"], "code": 400,
                     "message": "VMI is not running"},
                ],
            },
            portforward={"address": ".status.interfaces[0].ipAddress", "ports": "any"},
        )
    )  # fmt: skip
    vmis, vms = cfg.parents
    failed, running = vmis.subresources["console"].requires
    assert (failed.negate, failed.code, running.code) == (True, 409, 400)
    assert running.message == "VMI is not running"
    assert not failed.holds("Failed") and failed.holds("Pending") and failed.holds(None)
    assert running.holds("Running") and not running.holds("Scheduled")
    assert vmis.subresources["portforward"].ports == config.ANY_PORT
    assert vms.instance == config.InstanceSpec(
        "virtualmachineinstances", (config.Requirement(".status.created", (True,), code=409),)
    )


def test_booleans_never_equal_numbers() -> None:
    rule = config.Requirement(".status.ready", (True,))
    assert rule.holds(True) and not rule.holds(1) and not rule.holds("true")
    assert config.Requirement(".x", (1,)).holds(1) and not config.Requirement(".x", (1,)).holds(
        True
    )


def test_the_version_document_fields_come_from_the_file() -> None:
    cfg = config.parse({"serverVersion": {"gitVersion": "v1.7.0"}})
    assert cfg.server_version == {"gitVersion": "v1.7.0"}


def _one_console(console: object) -> dict[str, object]:
    return {
        "parents": [
            {
                "resource": "x",
                "kind": "X",
                "source": {"group": "g", "version": "v"},
                "subresources": {"console": console},
            }
        ]
    }


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (_one_console({"endpoint": "tcp://{.a:1"}), "console.endpoint: template"),
        (_one_console({"endpoint": ".a..b"}), "console.endpoint: field path"),
        (_one_console({"endpoint": ".a", "require": [{"field": ".p", "in": ["A"], "code": 200}]}),
         "code must be an HTTP error code"),
        (_one_console({"endpoint": ".a", "require": [{"field": ".p", "in": [], "notIn": []}]}),
         "exactly one of `in` and `notIn`"),
        (_one_console({"endpoint": ".a", "require": [{"field": "p", "in": ["A"]}]}),
         "field path"),
        (_one_console({"endpoint": ".a", "require": {".p": [["nested"]]}}),
         "not a string, number, boolean or null"),
        ({"serverVersion": {"gitversion": "v1"}}, "unknown keys"),
        (
            {"parents": [{**_kubevirt_like()["parents"][1]}]},  # type: ignore[index]
            "must be another parent",
        ),
    ],
)  # fmt: skip
def test_rule_and_template_errors_name_the_problem(data: object, words: str) -> None:
    with pytest.raises(config.ConfigError, match=words.replace("[", r"\[").replace("]", r"\]")):
        config.parse(data)


def test_default_policy_is_narrow() -> None:
    policy = config.Config().policy
    denied = {str(n) for n in policy.deny_cidrs}
    for net in ("127.0.0.0/8", "::1/128", "169.254.0.0/16", "fe80::/10", "fd00:ec2::254/128"):
        assert net in denied
    assert policy.socket_dirs == ("/run/subres/sockets",)


def test_deny_list_is_replaced_only_explicitly() -> None:
    assert (
        config.parse({"endpointPolicy": {}}).policy.deny_cidrs == config.Config().policy.deny_cidrs
    )
    policy = config.parse({"endpointPolicy": {"denyCIDRs": []}}).policy
    assert policy.deny_cidrs == ()


def parent_reading(path: str) -> dict[str, object]:
    return {
        "resource": "hosts",
        "kind": "Host",
        "source": {"group": "example.com", "version": "v1"},
        "subresources": {"console": {"endpoint": path}},
    }


@pytest.mark.parametrize("path", [".spec.console", ".metadata.annotations.console", ".statusx.a"])
def test_endpoints_outside_status_need_the_opt_in(path: str) -> None:
    with pytest.raises(config.ConfigError, match="endpointsFromSpec: true"):
        config.parse({"parents": [parent_reading(path)]})
    cfg = config.parse({"parents": [parent_reading(path)], "endpointsFromSpec": True})
    hosts = cfg.parent("hosts")
    assert hosts is not None and hosts.subresources["console"].endpoint == path


def test_the_node_that_picks_the_agent_is_trusted_too() -> None:
    data = {"parents": [dict(parent_reading(".status.console"), node=".spec.node")]}
    with pytest.raises(config.ConfigError, match=r"hosts\.node reads \.spec\.node"):
        config.parse(data)
    hosts = config.parse({**data, "endpointsFromSpec": True}).parent("hosts")
    assert hosts is not None and hosts.node == ".spec.node"


def test_opt_in_makes_the_default_machine_read_spec() -> None:
    machines = config.parse({"endpointsFromSpec": True}).parent("machines")
    assert machines is not None
    assert machines.subresources["vnc"].endpoint == ".spec.vnc.endpoint"
    assert machines.subresources["portforward"].ports == ".spec.portForward.ports"
    with pytest.raises(config.ConfigError, match="true or false"):
        config.parse({"endpointsFromSpec": "yes"})


@pytest.mark.parametrize(
    ("sub", "trusted"),
    [
        ({"endpoint": "unix:///run/vms/{.metadata.namespace}/{.metadata.uid}/serial"}, True),
        ({"endpoint": "tcp://{.status.interfaces[0].ipAddress}:5900"}, True),
        ({"endpoint": "tcp://{.spec.host}:5900"}, False),
        ({"endpoint": '.metadata.annotations["subres.dev/console"]'}, False),
        ({"endpoint": "unix:///run/{.metadata.labels.vm}/serial"}, False),
        ({"endpoint": ".status.console", "ssh": {"credentials": ".spec.secret"}}, False),
        ({"endpoint": ".status.console", "ssh": {"credentials": ".status.secret",
                                                   "command": "virsh console {.spec.domain}"}},
         False),
        ({"endpoint": ".status.console", "ssh": {"credentials": ".status.secret",
                                                   "command": "virsh console {.metadata.name}"}},
         True),
    ],
)  # fmt: skip
def test_every_field_a_backend_is_built_from_is_trusted(
    sub: dict[str, object], trusted: bool
) -> None:
    data = {"parents": [dict(parent_reading(".status.x"), subresources={"console": sub})]}
    if trusted:
        config.parse(data)
    else:
        with pytest.raises(config.ConfigError, match="endpointsFromSpec"):
            config.parse(data)
    config.parse({**data, "endpointsFromSpec": True})


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ({"parents": []}, "at least one resource"),
        ({"group": ".status.a"}, "group: '.status.a' is not a valid name"),
        ({"version": "V1"}, "version: 'V1' is not a valid name"),
        (
            {"parents": [parent_reading(".status.a"), parent_reading(".status.b")]},
            "each once",
        ),
        ({"parents": [dict(parent_reading(".status.a"), resource="Hosts")]}, "'Hosts'"),
        ({"parents": [dict(parent_reading(".status.a"), kind="host")]}, "hosts.kind: 'host'"),
    ],
)
def test_names_that_go_into_api_paths_are_checked(data: object, words: str) -> None:
    # Found by the config fuzz target: `parents: []` made the server fail at start.
    with pytest.raises(config.ConfigError, match=re.escape(words)):
        config.parse(data)


def _usbredir(spec: object) -> dict[str, object]:
    return {
        "parents": [
            {
                "resource": "vmis",
                "kind": "VMI",
                "source": {"group": "g", "version": "v"},
                "subresources": {"usbredir": spec},
            }
        ]
    }


def test_usbredir_has_a_cap_on_its_slots_and_a_slot_placeholder() -> None:
    machines = config.Config().parent("machines")
    assert machines is not None
    default = machines.subresources["usbredir"]
    assert (default.endpoint, default.slots) == (".status.usbredir.endpoints", config.USB_SLOTS)
    template = "unix:///run/vms/{.metadata.uid}/usbredir-{slot}"
    cfg = config.parse(_usbredir({"endpoint": template, "slots": 2}))
    vmis = cfg.parent("vmis")
    assert vmis is not None and vmis.subresources["usbredir"].slots == 2
    assert config.slot_source(template, 1) == "unix:///run/vms/{.metadata.uid}/usbredir-1"


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (_usbredir({"endpoint": ".status.usb", "slots": 0}), "slots must be a positive"),
        (_usbredir({"endpoint": ".status.usb", "slots": True}), "slots must be a positive"),
        (_usbredir({"endpoint": "unix:///{.spec.dir}/usb-{slot}"}),
         "usbredir reads its backend from .spec.dir"),
        (_usbredir({"endpoint": "unix:///x/usb-{slot}"}), "has no {.field.path} placeholder"),
        (_one_console({"endpoint": ".a", "slots": 2}), "only usbredir has slots"),
        (_one_console({"endpoint": "unix:///{.status.d}/{slot}"}),
         "only usbredir endpoints have a {slot}"),
    ],
)  # fmt: skip
def test_usbredir_settings_are_checked(data: object, words: str) -> None:
    with pytest.raises(config.ConfigError, match=re.escape(words)):
        config.parse(data)


def test_a_rule_on_null_asks_whether_a_field_is_set() -> None:
    cfg = config.parse(
        _usbredir(
            {
                "endpoint": ".status.usb",
                "require": [{"field": ".spec.passthrough", "notIn": [None], "code": 409}],
            }
        )
    )
    vmis = cfg.parent("vmis")
    assert vmis is not None
    rule = vmis.subresources["usbredir"].requires[0]
    assert not rule.holds(None)
    assert rule.holds({}) and rule.holds(False) and rule.holds(0) and rule.holds("")


def test_a_kind_names_several_consoles_each_inheriting_the_defaults_rules() -> None:
    cfg = config.parse(
        _one_console(
            {
                "endpoint": ".status.console",
                "require": {".status.phase": ["Running"]},
                "nodeLocal": True,
                "consoles": {
                    "serial1": {"endpoint": ".status.serial1", "keep": "always"},
                    "sol": {"endpoint": ".status.sol", "require": {".status.bmc": ["up"]}},
                },
            }
        )
    )
    parent = cfg.parent("x")
    assert parent is not None
    default, serial1, sol = parent.all_consoles()
    assert (default.label, default.unit) == ("serial0", "")
    assert (serial1.label, serial1.unit, serial1.keep) == ("serial1", "serial1", "always")
    assert serial1.requires == default.requires and serial1.node_local
    assert sol.requires == (config.Requirement(".status.bmc", ("up",)),)
    assert parent.console() is default and parent.console("serial0") is default
    assert parent.console("sol") is sol and parent.console("nosuch") is None
    named = config.parse(_one_console({"endpoint": ".status.console", "name": "tty0"}))
    assert named.parents[0].console("tty0") is named.parents[0].console()


@pytest.mark.parametrize(
    ("console", "words"),
    [
        ({"endpoint": ".a", "consoles": {"Serial1": {"endpoint": ".b"}}},
         "'Serial1' is not a valid"),
        ({"endpoint": ".a", "consoles": {"serial0": {"endpoint": ".b"}}},
         "the default console is called serial0 already"),
        ({"endpoint": ".a", "consoles": {"s1": {"endpoint": ".b", "slots": 1}}}, "unknown keys"),
        ({"endpoint": ".a", "consoles": {"s1": {}}}, "console needs an `endpoint`"),
        ({"endpoint": ".a", "consoles": {f"s{i}": {"endpoint": ".b"} for i in range(16)}},
         "at most 16 consoles"),
        ({"endpoint": ".a", "name": "../x"}, "console.name"),
        ({"endpoint": ".status.a", "consoles": {"s1": {"endpoint": ".spec.b"}}},
         "x.console s1 reads its backend from .spec.b"),
    ],
)  # fmt: skip
def test_console_names_and_settings_are_checked(console: object, words: str) -> None:
    with pytest.raises(config.ConfigError, match=re.escape(words)):
        config.parse(_one_console(console))
