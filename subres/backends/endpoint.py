"""Backend endpoints: parsing the URLs parent objects carry, and the policy that vets them.

Whoever can edit a parent object must not be able to make subres dial
anything it likes: every endpoint passes `check` (scheme, resolved address
against the allowed and denied networks, socket directory) before a dial.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
from dataclasses import dataclass
from urllib.parse import SplitResult, unquote, urlsplit

from subres.config import EndpointPolicySpec

__all__ = [
    "SSH_PORT",
    "Endpoint",
    "EndpointError",
    "EndpointForbidden",
    "EndpointInvalid",
    "EndpointUnresolved",
    "Target",
    "check",
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


@dataclass(frozen=True)
class Endpoint:
    """A parsed backend URL."""

    scheme: str
    host: str = ""
    port: int = 0
    path: str = ""
    user: str = ""
    """ssh: the login name, when the URL gives one."""

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


def parse(url: str) -> Endpoint:
    """An `Endpoint` from `tcp://host:port`, `unix:///path` or `ssh://[user@]host[:port]`."""
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # e.g. an unbalanced IPv6 bracket
        raise EndpointInvalid(f"endpoint {url!r} is not a URL: {exc}") from None
    if parts.scheme == "unix":
        path = parts.path or parts.netloc
        if not path.startswith("/"):
            raise EndpointInvalid(f"unix endpoint {url!r} needs an absolute path")
        return Endpoint("unix", path=os.path.normpath(path))
    if parts.scheme == "tcp":
        try:
            port = parts.port
        except ValueError:
            port = None
        if not parts.hostname or not port:
            raise EndpointInvalid(f"tcp endpoint {url!r} needs a host and a port")
        return Endpoint("tcp", host=parts.hostname, port=port)
    if parts.scheme == "ssh":
        return _ssh(url, parts)
    raise EndpointInvalid(f"unsupported endpoint scheme in {url!r}")


def _ssh(url: str, parts: SplitResult) -> Endpoint:
    try:
        port = parts.port or SSH_PORT
    except ValueError:
        raise EndpointInvalid(f"ssh endpoint {url!r} has a bad port") from None
    if parts.password is not None:
        raise EndpointInvalid(f"ssh endpoint {url!r} carries a password: use the Secret")
    if not parts.hostname or parts.path not in ("", "/") or parts.query or parts.fragment:
        raise EndpointInvalid(f"ssh endpoint {url!r} must be ssh://[user@]host[:port]")
    return Endpoint("ssh", host=parts.hostname, port=port, user=unquote(parts.username or ""))


async def check(endpoint: Endpoint, policy: EndpointPolicySpec) -> Target:
    """The `Target` to dial, or `EndpointError` saying why the policy forbids it."""
    if endpoint.scheme not in policy.schemes:
        raise EndpointForbidden(f"endpoint scheme {endpoint.scheme!r} is not allowed")
    if endpoint.scheme == "unix":
        if not any(_under(endpoint.path, d) for d in policy.socket_dirs):
            raise EndpointForbidden(f"socket {endpoint.path} is outside the allowed directories")
        return Target(endpoint)
    address = await _resolve(endpoint.host)
    ip = ipaddress.ip_address(address)
    if not any(ip in net for net in policy.allow_cidrs) or any(
        ip in net for net in policy.deny_cidrs
    ):
        raise EndpointForbidden(f"address {address} is not allowed by the endpoint policy")
    # Dial the address that was checked, so a DNS answer cannot change in between.
    return Target(endpoint, address)


def _under(path: str, directory: str) -> bool:
    directory = os.path.normpath(directory)
    return directory in ("/", path) or path.startswith(directory + "/")


async def _resolve(host: str) -> str:
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise EndpointUnresolved(f"cannot resolve {host}: {exc}") from None
    return str(infos[0][4][0])
