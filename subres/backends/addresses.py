"""Address canonicalisation for the endpoint policy: every spelling an IP address hides.

An IPv6 address can carry an IPv4 address inside it, and the kernel or a
gateway on the way delivers to that IPv4 address: an IPv4-mapped
`::ffff:127.0.0.2` is dialed by Linux as `127.0.0.2` itself; NAT64, 6to4 and
Teredo gateways forward to the embedded address. A policy that compares only
the literal address is bypassed by any of them, so `forms` lists the address
and every address embedded in it, and the policy checks each rule against each
form. Pure functions: no I/O.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable

__all__ = ["IPAddress", "IPNetwork", "canonical", "forms"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def canonical(ip: IPAddress) -> IPAddress:
    """The address the kernel dials for `ip`: IPv4-mapped unwrapped, zone id dropped.

    `::ffff:a.b.c.d` in any spelling (`::ffff:7f00:2`, the long form) is not
    an IPv6 address at all on the wire: a socket sends to `a.b.c.d`.
    """
    if isinstance(ip, ipaddress.IPv4Address):
        return ip
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ipaddress.IPv6Address(ip.packed) if ip.scope_id else ip


def forms(ip: IPAddress) -> tuple[IPAddress, ...]:
    """The canonical address, then every IPv4 address a translation form embeds in it."""
    first = canonical(ip)
    if isinstance(first, ipaddress.IPv4Address):
        return (first,)
    embedded: list[IPAddress] = []
    for extract in _EMBEDDINGS:
        embedded.extend(extract(first))
    return (first, *dict.fromkeys(embedded))


def _v4(data: bytes) -> ipaddress.IPv4Address:
    return ipaddress.IPv4Address(data)


def _in(prefix: str) -> Callable[[ipaddress.IPv6Address], bool]:
    network = ipaddress.IPv6Network(prefix)
    return lambda ip: ip in network


_COMPATIBLE = _in("::/96")  # RFC 4291 IPv4-compatible, deprecated but still parsed
_TRANSLATED = _in("::ffff:0:0:0/96")  # RFC 2765 SIIT IPv4-translated
_NAT64 = _in("64:ff9b::/96")  # RFC 6052 well-known prefix
_NAT64_LOCAL = _in("64:ff9b:1::/48")  # RFC 8215 local-use prefix, RFC 6052 /48 layout


def _last32(ip: ipaddress.IPv6Address) -> list[IPAddress]:
    if _COMPATIBLE(ip) or _TRANSLATED(ip) or _NAT64(ip):
        return [_v4(ip.packed[12:])]
    return []


def _nat64_local(ip: ipaddress.IPv6Address) -> list[IPAddress]:
    # A /48 prefix puts the IPv4 address in bits 48-63 and 72-87, around the zero "u" octet.
    return [_v4(ip.packed[6:8] + ip.packed[9:11])] if _NAT64_LOCAL(ip) else []


def _sixtofour(ip: ipaddress.IPv6Address) -> list[IPAddress]:
    return [ip.sixtofour] if ip.sixtofour is not None else []


def _teredo(ip: ipaddress.IPv6Address) -> list[IPAddress]:
    return list(ip.teredo) if ip.teredo is not None else []


_EMBEDDINGS: tuple[Callable[[ipaddress.IPv6Address], list[IPAddress]], ...] = (
    _last32,
    _nat64_local,
    _sixtofour,
    _teredo,
)
