"""Endpoint parsing and the policy checked before every dial, probed as an attacker would."""

from __future__ import annotations

import contextlib
import ipaddress
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from subres.backends import endpoint
from subres.config import DEFAULT_SOCKET_DIR, EndpointPolicySpec
from tests.backends.test_addresses import spellings

LOOPBACK_ONLY = EndpointPolicySpec(
    allow_cidrs=(ipaddress.ip_network("127.0.0.0/8"),), deny_cidrs=(), socket_dirs=("/run/vms",)
)
DEFAULT = EndpointPolicySpec()
EVERYWHERE_BUT_ONE = EndpointPolicySpec(
    allow_cidrs=(ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0")),
    deny_cidrs=(ipaddress.ip_network("127.0.0.2/32"),),
)


def test_parse() -> None:
    assert endpoint.parse("tcp://10.0.0.1:5900") == endpoint.Endpoint("tcp", "10.0.0.1", 5900)
    assert endpoint.parse("tcp://[::1]:22") == endpoint.Endpoint("tcp", "::1", 22)
    assert endpoint.parse("tcp://vm-1.ns.svc.:22/") == endpoint.Endpoint("tcp", "vm-1.ns.svc.", 22)
    assert endpoint.parse("tcp://[fe80::1%25eth0]:22").host == "fe80::1%eth0"
    assert endpoint.parse("unix:///run/vms/../vms/a.sock").path == "/run/vms/a.sock"


@pytest.mark.parametrize(
    "bad",
    [
        "tcp://host",
        "tcp://:80",
        "unix://relative",
        "unix:/run/x.sock",
        "unix:///run/x\0.sock",
        "http://x:1",
        "tcp://h:99999",
        "tcp://h:0",
        "tcp://[junk:22",
        "tcp://127.0.0.1]:1:22",
        "tcp://[127.0.0.1]:22",
        "tcp://[]:22",
        "tcp://user@host:22",
        "tcp://host:22/path",
        "tcp://host:22?q",
        "tcp://host:+22",
        "tcp://host:٢٢",
        "tcp://ho st:22",
        "tcp://a..b:22",
        "tcp://-a:22",
        "tcp://\0:22",
        "tcp://" + "a" * 300 + ":22",
        "tcp://[::1%]:22",
    ],
)
def test_parse_refuses(bad: str) -> None:
    with pytest.raises(endpoint.EndpointInvalid):
        endpoint.parse(bad)


@given(st.text(max_size=80))
def test_parse_raises_only_endpoint_invalid(text: str) -> None:
    for url in (text, "tcp://" + text, "unix://" + text, f"tcp://{text}:22"):
        with contextlib.suppress(endpoint.EndpointInvalid):
            endpoint.parse(url)


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


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "127.9.9.9",
        "::1",
        "169.254.169.254",
        "169.254.0.23",
        "fe80::a9fe:a9fe",
        "fd00:ec2::254",
        "fd20:ce::254",
        "100.100.100.200",
        "168.63.129.16",
        "192.0.0.192",
        "0.0.0.0",
        "0.1.2.3",
        "::",
        "224.0.0.1",
        "239.255.255.250",
        "ff02::1",
        "255.255.255.255",
    ],
)
async def test_default_policy_denies(address: str) -> None:
    with pytest.raises(endpoint.EndpointForbidden):
        await endpoint.check(endpoint.Endpoint("tcp", address, 80), DEFAULT)


@pytest.mark.parametrize("v4", ["127.0.0.1", "169.254.169.254", "0.0.0.0", "224.0.0.1"])
async def test_default_policy_denies_every_spelling(v4: str) -> None:
    for spelling in spellings(ipaddress.IPv4Address(v4)):
        url = f"tcp://[{spelling}]:80"
        with pytest.raises(endpoint.EndpointForbidden):
            await endpoint.check(endpoint.parse(url), DEFAULT)


async def test_a_denied_ipv4_address_is_denied_in_every_spelling() -> None:
    # The hole of issue 10: ::ffff:127.0.0.2 is not "in" 127.0.0.2/32, yet Linux dials it.
    for spelling in spellings(ipaddress.IPv4Address("127.0.0.2")):
        with pytest.raises(endpoint.EndpointForbidden):
            await endpoint.check(endpoint.Endpoint("tcp", spelling, 80), EVERYWHERE_BUT_ONE)
    assert (await endpoint.check(endpoint.parse("tcp://127.0.0.3:80"), EVERYWHERE_BUT_ONE)).address


async def test_every_form_must_be_allowed() -> None:
    # NAT64 of a loopback address: the IPv4 form is allowed, the IPv6 one is not.
    with pytest.raises(endpoint.EndpointForbidden):
        await endpoint.check(endpoint.parse("tcp://[64:ff9b::7f00:1]:80"), LOOPBACK_ONLY)


async def test_mapped_address_is_dialed_as_ipv4() -> None:
    target = await endpoint.check(endpoint.parse("tcp://[::ffff:10.0.0.5]:22"), DEFAULT)
    assert target.address == "10.0.0.5"
    target = await endpoint.check(endpoint.parse("tcp://[2001:db8::5]:22"), DEFAULT)
    assert target.address == "2001:db8::5"


async def test_names_resolving_to_denied_addresses_are_refused() -> None:
    for url in ("tcp://localhost:22", "tcp://2130706433:22", "tcp://0x7f.1:22"):
        with pytest.raises(endpoint.EndpointForbidden):
            await endpoint.check(endpoint.parse(url), DEFAULT)


async def test_default_socket_dir_is_subres_own() -> None:
    assert DEFAULT.socket_dirs == (DEFAULT_SOCKET_DIR,) == ("/run/subres/sockets",)
    for path in ("/run/containerd/containerd.sock", "/var/run/docker.sock", "/run/subres.sock"):
        with pytest.raises(endpoint.EndpointForbidden):
            await endpoint.check(endpoint.parse(f"unix://{path}"), DEFAULT)


async def test_symlink_out_of_an_allowed_dir_is_refused(tmp_path: Path) -> None:
    allowed, outside = tmp_path / "allowed", tmp_path / "outside"
    allowed.mkdir()
    outside.mkdir()
    (outside / "runtime.sock").touch()
    (allowed / "vm.sock").symlink_to(outside / "runtime.sock")
    (allowed / "sub").symlink_to(outside)
    policy = EndpointPolicySpec(socket_dirs=(str(allowed),))
    for path in (allowed / "vm.sock", allowed / "sub" / "runtime.sock"):
        with pytest.raises(endpoint.EndpointForbidden, match="resolved to"):
            await endpoint.check(endpoint.parse(f"unix://{path}"), policy)


async def test_symlink_inside_an_allowed_dir_is_dialed_resolved(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (real / "vm.sock").touch()
    (tmp_path / "link").symlink_to(real)
    (real / "alias.sock").symlink_to("vm.sock")
    # Both the directory in the policy and the socket path go through symlinks.
    policy = EndpointPolicySpec(socket_dirs=(str(tmp_path / "link"),))
    target = await endpoint.check(endpoint.parse(f"unix://{real}/alias.sock"), policy)
    assert target.endpoint.path == str((real / "vm.sock").resolve())


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
    allowed = EndpointPolicySpec(schemes=("ssh",), allow_cidrs=loopback, deny_cidrs=())
    target = await endpoint.check(endpoint.parse("ssh://u@localhost:2222"), allowed)
    assert target.address in ("127.0.0.1", "::1") and target.endpoint.user == "u"
