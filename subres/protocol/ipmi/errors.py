"""Exceptions of the IPMI codec.

Everything a hostile or broken network can make the codec see raises a
subclass of `IpmiError`; a caller that reads datagrams catches `PacketError`
and drops the datagram, as a BMC drops what it cannot use. `HandshakeError`
ends a session before it opened and says which side is at fault, so that a
backend can answer with the right HTTP code.
"""

from __future__ import annotations

import enum

__all__ = ["Fault", "HandshakeError", "IntegrityError", "IpmiError", "PacketError", "UsageError"]


class IpmiError(Exception):
    """Base of every error the IPMI codec raises."""


class PacketError(IpmiError):
    """A datagram that is not a well-formed RMCP / IPMI packet (short, bad checksum, ...)."""


class IntegrityError(PacketError):
    """A packet whose AuthCode or confidentiality padding does not check out."""


class UsageError(IpmiError):
    """The caller asked for something the session's state does not allow."""


class Fault(enum.Enum):
    """Who is to blame when a session cannot be opened or kept."""

    CREDENTIALS = "credentials"
    """The BMC refused the user name or the password."""
    REFUSED = "refused"
    """The BMC refused the request (cipher suite, privilege, a payload)."""
    BUSY = "busy"
    """SOL is active on another session."""
    PROTOCOL = "protocol"
    """The BMC broke the protocol."""
    TIMEOUT = "timeout"
    """The BMC stopped answering."""


class HandshakeError(IpmiError):
    """A session that cannot go on; `fault` says why in a way a backend can map to a code."""

    def __init__(self, message: str, fault: Fault) -> None:
        super().__init__(message)
        self.fault = fault
