"""The SPDY/3.1 upgrade handshake of Kubernetes streams, sans I/O.

Owns the decisions of apimachinery's `httpstream.Handshake` and the SPDY
response upgrader: is a request a SPDY/3.1 upgrade, which stream protocol
(`X-Stream-Protocol-Version`) to speak, and the headers of the answer. The
caller writes the answer; nothing here touches a socket.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = [
    "ACCEPTED_HEADER",
    "SPDY_UPGRADE",
    "VERSION_HEADER",
    "HandshakeRefused",
    "is_spdy_upgrade",
    "negotiate",
    "offered",
    "switching_headers",
]

SPDY_UPGRADE = "SPDY/3.1"
VERSION_HEADER = "X-Stream-Protocol-Version"
ACCEPTED_HEADER = "X-Accepted-Stream-Protocol-Versions"


class HandshakeRefused(Exception):
    """The upgrade cannot proceed: answer `code` with `message`; a 403 lists the
    protocols the server accepts, one `X-Accepted-Stream-Protocol-Versions` header each."""

    def __init__(self, code: int, message: str, *, accepted: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.accepted = accepted


def is_spdy_upgrade(connection: Iterable[str], upgrade: Iterable[str]) -> bool:
    """True when `Connection` mentions upgrade and `Upgrade` mentions SPDY/3.1.

    Substring tests, case-insensitive, as the Go upgrader checks them.
    """
    wants_upgrade = any("upgrade" in value.lower() for value in connection)
    return wants_upgrade and any(SPDY_UPGRADE.lower() in value.lower() for value in upgrade)


def offered(values: Iterable[str]) -> list[str]:
    """The protocols of every `X-Stream-Protocol-Version` line, comma-split, in order."""
    return [p.strip(" ") for value in values for p in value.split(",") if p.strip(" ")]


def negotiate(values: Sequence[str] | None, supported: Sequence[str]) -> str:
    """The first protocol the client offers that the server supports.

    `values` are the request's `X-Stream-Protocol-Version` lines (None when the
    header is absent). Raises `HandshakeRefused`: 400 when nothing is offered,
    403 when nothing offered is supported.
    """
    if not values:
        raise HandshakeRefused(
            400, f"unable to upgrade: header {VERSION_HEADER} does not exist in request"
        )
    protocols = offered(values)
    if not protocols:
        raise HandshakeRefused(
            400,
            f"unable to upgrade: header {VERSION_HEADER} contains {list(values)}, "
            "but no valid protocols",
        )
    for protocol in protocols:
        if protocol in supported:
            return protocol
    raise HandshakeRefused(
        403,
        "unable to upgrade: unable to negotiate protocol: "
        f"client supports {protocols}, server accepts {list(supported)}",
        accepted=tuple(supported),
    )


def switching_headers(protocol: str) -> tuple[tuple[str, str], ...]:
    """The headers of the `101 Switching Protocols` answer choosing `protocol`."""
    return (
        ("Connection", "Upgrade"),
        ("Upgrade", SPDY_UPGRADE),
        (VERSION_HEADER, protocol),
    )
