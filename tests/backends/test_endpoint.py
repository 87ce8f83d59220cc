"""Endpoint parsing and the policy checked before every dial."""

from __future__ import annotations

import ipaddress

import pytest

from subres.backends import endpoint
from subres.config import EndpointPolicySpec

LOOPBACK_ONLY = EndpointPolicySpec(
    allow_cidrs=(ipaddress.ip_network("127.0.0.0/8"),), socket_dirs=("/run/vms",)
)


def test_parse() -> None:
    assert endpoint.parse("tcp://10.0.0.1:5900") == endpoint.Endpoint("tcp", "10.0.0.1", 5900)
    assert endpoint.parse("tcp://[::1]:22") == endpoint.Endpoint("tcp", "::1", 22)
    assert endpoint.parse("unix:///run/vms/../vms/a.sock").path == "/run/vms/a.sock"
    for bad in ("tcp://host", "tcp://:80", "unix://relative", "http://x:1", "tcp://h:99999"):
        with pytest.raises(endpoint.EndpointInvalid):
            endpoint.parse(bad)


@pytest.mark.parametrize(
    ("url", "error"),
    [
        ("tcp://10.1.2.3:22", endpoint.EndpointForbidden),
        ("tcp://169.254.169.254:80", endpoint.EndpointForbidden),
        ("unix:///run/vms/../../etc/x.sock", endpoint.EndpointForbidden),
        ("unix:///run/vmsecret/x.sock", endpoint.EndpointForbidden),
        ("tcp://no-such-host.invalid:22", endpoint.EndpointUnresolved),
    ],
)
async def test_policy_refuses(url: str, error: type[endpoint.EndpointError]) -> None:
    with pytest.raises(error):
        await endpoint.check(endpoint.parse(url), LOOPBACK_ONLY)


async def test_policy_allows_and_pins_the_checked_address() -> None:
    target = await endpoint.check(endpoint.parse("tcp://localhost:22"), LOOPBACK_ONLY)
    assert ipaddress.ip_address(target.address).is_loopback
    target = await endpoint.check(endpoint.parse("unix:///run/vms/a.sock"), LOOPBACK_ONLY)
    assert target.endpoint.path == "/run/vms/a.sock"


async def test_default_policy_denies_link_local_and_foreign_sockets() -> None:
    default = EndpointPolicySpec()
    with pytest.raises(endpoint.EndpointForbidden):
        await endpoint.check(endpoint.parse("tcp://169.254.169.254:80"), default)
    with pytest.raises(endpoint.EndpointForbidden):
        await endpoint.check(endpoint.parse("unix:///var/lib/secret.sock"), default)


def test_parse_ssh() -> None:
    assert endpoint.parse("ssh://admin@bmc.example:2222") == endpoint.Endpoint(
        "ssh", "bmc.example", 2222, user="admin"
    )
    assert endpoint.parse("ssh://10.0.0.9") == endpoint.Endpoint("ssh", "10.0.0.9", 22)
    assert str(endpoint.parse("ssh://root@[fd00::1]")) == "ssh://root@[fd00::1]:22"
    for bad, words in [
        ("ssh://admin:hunter2@bmc", "carries a password"),
        ("ssh://bmc/some/path", "must be ssh://"),
        ("ssh://bmc?x=1", "must be ssh://"),
        ("ssh://bmc:99999", "bad port"),
        ("ssh://[fd00::1", "not a URL"),
    ]:
        with pytest.raises(endpoint.EndpointInvalid, match=words):
            endpoint.parse(bad)


async def test_ssh_is_refused_unless_the_policy_lists_it() -> None:
    with pytest.raises(endpoint.EndpointForbidden, match="'ssh' is not allowed"):
        await endpoint.check(endpoint.parse("ssh://127.0.0.1"), LOOPBACK_ONLY)
    loopback = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))
    allowed = EndpointPolicySpec(schemes=("ssh",), allow_cidrs=loopback)
    target = await endpoint.check(endpoint.parse("ssh://u@localhost:2222"), allowed)
    assert target.address in ("127.0.0.1", "::1") and target.endpoint.user == "u"
