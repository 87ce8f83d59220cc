"""Field paths, port lists and endpoint templates over real-looking parent objects."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import pytest
from hypothesis import given
from hypothesis import strategies as st

from subres import fields
from subres.backends import endpoint as endpoints

VMI: dict[str, Any] = {
    "metadata": {
        "name": "vm1",
        "namespace": "team-a",
        "uid": "4d1c6a3e-8c1f-4b8e-9b1a-0c2d7c9b3f11",
        "annotations": {"subres.dev/console": "tcp://10.0.0.5:7000", "a.b": "dots"},
    },
    "status": {
        "phase": "Running",
        "interfaces": [{"ipAddress": "10.244.1.7", "name": "default"}, {"ipAddress": "fd00::7"}],
        "ports": "22, 8080",
        "conditions": [
            {"type": "Ready", "status": "True"},
            {"type": "Paused", "status": "True", "reason": "PausedByUser"},
        ],
    },
}


@pytest.mark.parametrize(
    ("text", "value"),
    [
        (".status.phase", "Running"),
        ('.metadata.annotations["subres.dev/console"]', "tcp://10.0.0.5:7000"),
        (".metadata.annotations['a.b']", "dots"),
        (".status.interfaces[0].ipAddress", "10.244.1.7"),
        (".status.interfaces[1].ipAddress", "fd00::7"),
        (".status.interfaces[2].ipAddress", None),
        (".status.interfaces.ipAddress", None),
        (".status.phase[0]", None),
        (".metadata.annotations.subres", None),
        ('["metadata"].name', "vm1"),
        (".status.conditions[type=Paused].status", "True"),
        ('.status.conditions[type="Paused"].reason', "PausedByUser"),
        (".status.conditions[type=AgentConnected].status", None),
        (".status.phase[type=Paused]", None),
    ],
)
def test_paths_read_keys_with_dots_and_slashes_and_list_indexes(text: str, value: Any) -> None:
    assert fields.path(text).get(VMI) == value


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "is empty"),
        ("status.phase", "expected"),
        (".status..phase", "a name must follow"),
        (".status.interfaces[-1]", "expected"),
        (".status.interfaces[x]", "expected"),
        ('.metadata.annotations["unterminated]', "expected"),
        ('.metadata.annotations[""]', "empty key"),
        (".status.phase ", "expected"),
    ],
)
def test_bad_paths_say_where(text: str, words: str) -> None:
    with pytest.raises(fields.FieldError, match=words):
        fields.path(text)


@pytest.mark.parametrize(
    ("value", "ports"),
    [
        ([22, 8080], {22, 8080}),
        (["22", 8080], {22, 8080}),
        ("22,8080", {22, 8080}),
        (" 22 , 8080 ,", {22, 8080}),
        (443, {443}),
        ("", set()),
        (None, None),
    ],
)
def test_ports_from_lists_numbers_and_strings(value: Any, ports: set[int] | None) -> None:
    assert fields.ports(value) == (None if ports is None else frozenset(ports))


@pytest.mark.parametrize(
    "value", ["22,http", [0], [65536], [True], "22;80", {"a": 1}, [2.5], "2" * 5000, ["9" * 5000]]
)
def test_ports_refuse_what_is_not_a_port(value: Any) -> None:
    with pytest.raises(fields.FieldError):
        fields.ports(value)


def test_a_template_builds_an_endpoint_from_fields() -> None:
    tpl = fields.template("unix:///var/run/vms/{.metadata.namespace}/{.metadata.name}/serial.sock")
    assert tpl.render(VMI) == "unix:///var/run/vms/team-a/vm1/serial.sock"
    tpl = fields.template("unix:///var/run/kubevirt-private/{ .metadata.uid }/virt-serial0")
    assert tpl.render(VMI).endswith("/4d1c6a3e-8c1f-4b8e-9b1a-0c2d7c9b3f11/virt-serial0")


def test_ip_addresses_go_in_as_hosts() -> None:
    v4 = fields.template("tcp://{.status.interfaces[0].ipAddress}:22").render(VMI)
    v6 = fields.template("tcp://{.status.interfaces[1].ipAddress}:22").render(VMI)
    assert (v4, v6) == ("tcp://10.244.1.7:22", "tcp://[fd00::7]:22")
    assert endpoints.parse(v6) == endpoints.Endpoint("tcp", host="fd00::7", port=22)


HOSTILE = [
    "../../etc",
    "..",
    ".",
    "a/../b",
    "evil@host",
    "host:2222",
    "a?b",
    "a#b",
    "a%2e%2e",
    "a b",
    "fe80::1%eth0",
    "ümlaut",
    "a\nb",
    "-oProxyCommand=sh",
]


@pytest.mark.parametrize("name", HOSTILE)
def test_a_field_value_cannot_change_the_url_structure(name: str) -> None:
    obj = {"metadata": {"name": name, "namespace": "ns"}}
    tpl = fields.template("unix:///var/run/vms/{.metadata.namespace}/{.metadata.name}/serial.sock")
    with pytest.raises(fields.FieldError, match="may not go into an endpoint"):
        tpl.render(obj)


@given(st.text(max_size=40))
def test_whatever_a_field_holds_the_url_keeps_its_shape(name: str) -> None:
    """Any value either is refused or stays inside its one host or path segment."""
    obj = {"metadata": {"name": name}}
    for text, where in (
        ("tcp://{.metadata.name}:22", "host"),
        ("unix:///run/vms/{.metadata.name}/serial.sock", "path"),
        ("ssh://admin@{.metadata.name}:2222", "host"),
    ):
        try:
            url = fields.template(text).render(obj)
        except fields.FieldError:
            continue
        parts = urlsplit(url)
        if where == "path":
            assert parts.path.split("/")[:3] == ["", "run", "vms"]
            assert parts.path.endswith("/serial.sock") and parts.path.count("/") == 4
            assert ".." not in parts.path.split("/")
        else:
            assert parts.port in (22, 2222) and parts.path == "" and not parts.query
            assert parts.username in (None, "admin") and parts.hostname


@pytest.mark.parametrize(
    ("obj", "words"),
    [
        ({"metadata": {}}, "is not set"),
        ({"metadata": {"name": ""}}, "is not set"),
        ({"metadata": {"name": ["a"]}}, "holds a list"),
        ({"metadata": {"name": True}}, "holds a bool"),
    ],
)
def test_unset_or_structured_fields_are_refused(obj: dict[str, Any], words: str) -> None:
    with pytest.raises(fields.FieldError, match=words):
        fields.template("tcp://{.metadata.name}:1").render(obj)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("tcp://static:1", "no {.field.path} placeholder"),
        ("tcp://{.a:1", "unbalanced"),
        ("tcp://{.a}}:1", "unbalanced"),
        ("tcp://{a}:1", "expected"),
    ],
)
def test_bad_templates_are_refused(text: str, words: str) -> None:
    with pytest.raises(fields.FieldError, match=words):
        fields.template(text)


def test_a_configured_value_is_a_path_or_a_template() -> None:
    assert fields.read(".status.interfaces[0].ipAddress", VMI) == "10.244.1.7"
    assert fields.read("tcp://{.metadata.name}:5900", VMI) == "tcp://vm1:5900"
