"""Backend endpoints: parsing the URLs parent objects carry, and the policy that vets them.

Whoever can edit a parent object must not be able to make subres dial
anything it likes: every endpoint passes `check` (scheme, resolved address
against the allowed and denied networks, socket directory) before a dial.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import re
import socket
from dataclasses import dataclass
from urllib.parse import parse_qsl, unquote, urlsplit

from subres.backends import addresses
from subres.config import EndpointPolicySpec

__all__ = [
    "IPMI_OPTIONS",
    "IPMI_PORT",
    "SSH_PORT",
    "Endpoint",
    "EndpointError",
    "EndpointForbidden",
    "EndpointInvalid",
    "EndpointUnresolved",
    "Target",
    "allowed",
    "check",
    "host",
    "ipv6",
    "parse",
]


class EndpointError(ValueError):
    """An endpoint that cannot be dialed; `code` is the HTTP status to answer with."""

    code = 400


class EndpointInvalid(EndpointError):
    """The endpoint URL is malformed or of an unknown scheme."""


class EndpointForbidden(EndpointError):
    """The endpoint policy forbids this target."""

    code = 403


class EndpointUnresolved(EndpointError):
    """The host name does not resolve (now)."""

    code = 503


SSH_PORT = 22
IPMI_PORT = 623
IPMI_OPTIONS = ("privilege", "cipherSuite")
"""What an `ipmi://` endpoint's query may say (each at most once)."""


@dataclass(frozen=True)
class Endpoint:
    """A parsed backend URL."""

    scheme: str
    host: str = ""
    port: int = 0
    path: str = ""
    user: str = ""
    """ssh: the login name, when the URL gives one."""
    options: tuple[tuple[str, str], ...] = ()
    """ipmi: the query's `IPMI_OPTIONS`, as given."""

    def __str__(self) -> str:
        if self.scheme == "unix":
            return f"unix://{self.path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        user = f"{self.user}@" if self.user else ""
        return f"{self.scheme}://{user}{host}:{self.port}"


@dataclass(frozen=True)
class Target:
    """Where to dial after the policy check: a vetted IP address, or a socket path."""

    endpoint: Endpoint
    address: str = ""


_TCP = re.compile(r"tcp://(?:\[(?P<ip6>[^\]/]*)\]|(?P<host>[^\[\]:/]*)):(?P<port>[0-9]{1,5})/?")
_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
_UNIX = "unix://"


def parse(url: str) -> Endpoint:
    """An `Endpoint` from `tcp://host:port`, `tcp://[ipv6]:port`, `unix:///path`,
    `ssh://[user@]host[:port]` or `ipmi://host[:port][?privilege=…&cipherSuite=…]`.

    Strict on purpose: no user info, path, query or fragment on `tcp`, ports
    1-65535 in ASCII digits, host names of DNS labels, IPv6 only in brackets.
    """
    if url.startswith(_UNIX):
        path = url[len(_UNIX) :]
        if not path.startswith("/") or "\0" in path:
            raise EndpointInvalid(f"unix endpoint {_shown(url)} needs an absolute path")
        return Endpoint("unix", path=os.path.normpath(path))
    if url.startswith("ssh:"):
        return _ssh(url)
    if url.startswith("ipmi:"):
        return _ipmi(url)
    if not url.startswith("tcp:"):
        raise EndpointInvalid(_unsupported(url))
    match = _TCP.fullmatch(url)
    port = int(match["port"]) if match else 0
    if match is None or not 0 < port <= 0xFFFF:
        raise EndpointInvalid(f"tcp endpoint {_shown(url)} needs a host and a port (1-65535)")
    ip6 = match["ip6"]
    if ip6 is not None:
        # RFC 6874 writes a zone id as %25zone inside the brackets.
        return Endpoint("tcp", host=ipv6(ip6.replace("%25", "%", 1)), port=port)
    return Endpoint("tcp", host=host(match["host"]), port=port)


_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]{0,40})://")


def _unsupported(url: str) -> str:
    """Why `url` is refused, naming its scheme (a BMC's `redfish+https`, say) when it has one."""
    match = _SCHEME.match(url)
    if match is None:
        return f"unsupported endpoint scheme in {_shown(url)}: it names none (scheme://…)"
    return (
        f"unsupported endpoint scheme {match[1]!r} in {_shown(url)}: "
        "subres dials tcp, unix, ssh and ipmi"
    )


def host(text: str) -> str:
    """`text` if it is a host name or an IP address (IPv6 unbracketed), else `EndpointInvalid`."""
    if ":" in text:
        return ipv6(text)
    labels = text.removesuffix(".").split(".")
    if len(text) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        raise EndpointInvalid(f"{_shown(text)} is not a host name or an IP address")
    return text


def ipv6(text: str) -> str:
    """`text` if it is an IPv6 address (zone id allowed), else `EndpointInvalid`."""
    try:
        return str(ipaddress.IPv6Address(text))
    except ValueError:
        raise EndpointInvalid(f"{_shown(text)} is not an IPv6 address") from None


def _shown(text: str) -> str:
    return repr(text if len(text) <= 100 else text[:100] + "...")


def _ssh(url: str) -> Endpoint:
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # e.g. an unbalanced IPv6 bracket
        raise EndpointInvalid(f"ssh endpoint {_shown(url)} is not a URL: {exc}") from None
    try:
        port = parts.port or SSH_PORT
    except ValueError:
        raise EndpointInvalid(f"ssh endpoint {_shown(url)} has a bad port") from None
    if parts.password is not None:
        raise EndpointInvalid(f"ssh endpoint {_shown(url)} carries a password: use the Secret")
    if not parts.hostname or parts.path not in ("", "/") or parts.query or parts.fragment:
        raise EndpointInvalid(f"ssh endpoint {_shown(url)} must be ssh://[user@]host[:port]")
    user = unquote(parts.username or "")
    return Endpoint("ssh", host=host(parts.hostname), port=port, user=user)


def _ipmi(url: str) -> Endpoint:
    try:
        parts = urlsplit(url)
        port = parts.port or IPMI_PORT
        options = parse_qsl(parts.query, strict_parsing=True) if parts.query else []
    except ValueError as exc:
        raise EndpointInvalid(f"ipmi endpoint {_shown(url)} is not a URL: {exc}") from None
    if parts.username is not None or parts.password is not None:
        raise EndpointInvalid(f"ipmi endpoint {_shown(url)} carries a user: use the Secret")
    if not parts.hostname or parts.path not in ("", "/") or parts.fragment:
        raise EndpointInvalid(f"ipmi endpoint {_shown(url)} must be ipmi://host[:port][?options]")
    names = [name for name, _ in options]
    if any(name not in IPMI_OPTIONS for name in names) or len(set(names)) != len(names):
        raise EndpointInvalid(
            f"ipmi endpoint {_shown(url)} may say only {' and '.join(IPMI_OPTIONS)}, once each"
        )
    return Endpoint("ipmi", host=host(parts.hostname), port=port, options=tuple(options))


async def check(endpoint: Endpoint, policy: EndpointPolicySpec) -> Target:
    """The `Target` to dial, or `EndpointError` saying why the policy forbids it."""
    if endpoint.scheme not in policy.schemes:
        raise EndpointForbidden(f"endpoint scheme {endpoint.scheme!r} is not allowed")
    if endpoint.scheme == "unix":
        return Target(Endpoint("unix", path=_socket_path(endpoint.path, policy)))
    ip = await _resolve(endpoint.host)
    if not allowed(ip, policy):
        others = [str(f) for f in addresses.forms(ip) if f != ip]
        shown = f"{ip} (that is {', '.join(others)})" if others else str(ip)
        raise EndpointForbidden(f"address {shown} is not allowed by the endpoint policy")
    # Dial the address that was checked, so a DNS answer cannot change in between;
    # its canonical form, so an IPv4-mapped spelling is dialed as the IPv4 address it is.
    # (An IPv6 address keeps its zone id, which only says which link to use.)
    dialed = addresses.canonical(ip)
    return Target(endpoint, str(ip) if dialed.version == 6 else str(dialed))


def allowed(ip: addresses.IPAddress, policy: EndpointPolicySpec) -> bool:
    """Whether every form of `ip` is in an allowed network and none in a denied one."""
    forms = addresses.forms(ip)
    return all(any(f in net for net in policy.allow_cidrs) for f in forms) and not any(
        f in net for f in forms for net in policy.deny_cidrs
    )


def _socket_path(path: str, policy: EndpointPolicySpec) -> str:
    """`path` with every symlink resolved, if that lies in an allowed directory."""
    real = os.path.realpath(path)
    if not any(_under(real, os.path.realpath(d)) for d in policy.socket_dirs):
        shown = path if real == path else f"{path} (resolved to {real})"
        raise EndpointForbidden(f"socket {shown} is outside the allowed directories")
    return real


def _under(path: str, directory: str) -> bool:
    return directory in ("/", path) or path.startswith(directory + "/")


async def _resolve(host: str) -> addresses.IPAddress:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise EndpointUnresolved(f"cannot resolve {host}: {exc}") from None
    return ipaddress.ip_address(infos[0][4][0])
