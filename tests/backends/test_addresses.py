"""Every spelling of an address the kernel or a gateway delivers to an IPv4 address."""

from __future__ import annotations

import ipaddress

from hypothesis import given
from hypothesis import strategies as st

from subres.backends import addresses

V4 = ipaddress.IPv4Address


def spellings(v4: V4) -> list[str]:
    """IPv6 addresses that end up at `v4`: mapped, compatible, SIIT, NAT64, 6to4, Teredo."""
    hexed = f"{int(v4) >> 16:x}:{int(v4) & 0xFFFF:x}"
    raw = v4.packed
    obscured = bytes(b ^ 0xFF for b in raw)
    teredo_client = ipaddress.IPv6Address(
        bytes.fromhex("20010000") + raw + b"\x80\x00" + b"\xff\xff" + obscured
    )
    return [
        f"::ffff:{v4}",
        f"::ffff:{hexed}",
        f"0:0:0:0:0:ffff:{v4}",
        f"0000:0000:0000:0000:0000:FFFF:{hexed}",
        f"::{hexed}",
        f"::ffff:0:{v4}",
        f"64:ff9b::{v4}",
        f"64:ff9b:1:{raw[:2].hex()}:{raw[2]:04x}:{raw[3]:02x}00::",
        f"2002:{hexed}::1",
        str(teredo_client),
    ]


@given(st.ip_addresses(v=4))
def test_every_spelling_yields_the_embedded_ipv4(v4: V4) -> None:
    for spelling in spellings(v4):
        assert v4 in addresses.forms(ipaddress.ip_address(spelling)), spelling


@given(st.ip_addresses(v=4))
def test_mapped_is_the_ipv4_address_itself(v4: V4) -> None:
    for spelling in spellings(v4)[:4]:
        assert addresses.canonical(ipaddress.ip_address(spelling)) == v4
        assert addresses.forms(ipaddress.ip_address(spelling)) == (v4,)


def test_nat64_local_use_prefix_skips_the_u_octet() -> None:
    # RFC 6052 2.2's /48 example: 192.0.2.33 in 2001:db8:122:344:c0:2:2100::, here in
    # the RFC 8215 prefix: bits 48-63 hold c000, bits 64-71 the u octet, 72-87 0221.
    ip = ipaddress.ip_address("64:ff9b:1:c000:2:2100::")
    assert V4("192.0.2.33") in addresses.forms(ip)


def test_plain_addresses_have_one_form() -> None:
    assert addresses.forms(ipaddress.ip_address("10.1.2.3")) == (V4("10.1.2.3"),)
    assert addresses.forms(ipaddress.ip_address("2001:db8::1")) == (
        ipaddress.ip_address("2001:db8::1"),
    )


def test_zone_id_is_dropped_for_the_checks() -> None:
    assert addresses.canonical(ipaddress.ip_address("fe80::1%eth0")) == ipaddress.ip_address(
        "fe80::1"
    )
