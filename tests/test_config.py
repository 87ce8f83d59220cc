"""The configuration file: defaults, a full file, and the errors a typo gets."""

from __future__ import annotations

import pytest

from subres import config


def test_defaults_serve_machines() -> None:
    cfg = config.Config()
    assert (cfg.group, cfg.version) == ("subresources.subres.dev", "v1alpha1")
    machines = cfg.parent("machines")
    assert machines is not None and machines.api_version == "subres.dev/v1alpha1"
    assert set(machines.subresources) == set(config.SUBRESOURCES)
    assert machines.subresources["console"].endpoint == ".spec.console.endpoint"
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
                    "node": ".spec.consumerRef.node",
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
            "session": {"pingInterval": 30, "connectTimeout": 2.5},
        }
    )
    hosts = cfg.parent("hosts")
    assert hosts is not None and hosts.singular == "host" and hosts.crd_resource == "hosts"
    rule = hosts.subresources["console"].requires[0]
    assert rule == config.Requirement(".status.state", ("provisioned", "ready"))
    assert hosts.node == ".spec.consumerRef.node" and hosts.subresources["console"].node_local
    assert cfg.session.ping_interval == 30 and cfg.session.read_size == 65536
    assert cfg.policy.socket_dirs == ()


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ({"grup": "x"}, "unknown keys ['grup']"),
        ({"session": {"pingInterval": 0}}, "pingInterval must be a positive number"),
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
