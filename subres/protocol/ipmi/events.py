"""Events an IPMI `Client` reports: each a frozen dataclass named for what already happened."""

from __future__ import annotations

from dataclasses import dataclass

from subres.protocol.ipmi.errors import Fault

__all__ = [
    "DataReceived",
    "Event",
    "PayloadActivated",
    "PayloadDeactivated",
    "SessionClosed",
    "SessionFailed",
    "SessionOpened",
    "StaleSessionDeactivated",
]


@dataclass(frozen=True)
class SessionOpened:
    """RAKP succeeded and the session runs at `privilege`."""

    privilege: int


@dataclass(frozen=True)
class StaleSessionDeactivated:
    """SOL was active on another session and was deactivated to take it over."""


@dataclass(frozen=True)
class PayloadActivated:
    """SOL is ours: the BMC takes `inbound_size` bytes a packet and sends `outbound_size`."""

    inbound_size: int
    outbound_size: int
    port: int
    """The UDP port the BMC expects SOL packets on (a BMC may name another than 623)."""


@dataclass(frozen=True)
class DataReceived:
    """Characters from the serial port."""

    data: bytes


@dataclass(frozen=True)
class PayloadDeactivated:
    """SOL ended while the session lived (the BMC deactivated it, or another session did)."""

    reason: str


@dataclass(frozen=True)
class SessionClosed:
    """The session ended as asked (`Client.close`)."""


@dataclass(frozen=True)
class SessionFailed:
    """The session cannot go on; `fault` says whose fault, `reason` says what happened."""

    reason: str
    fault: Fault


Event = (
    SessionOpened
    | StaleSessionDeactivated
    | PayloadActivated
    | DataReceived
    | PayloadDeactivated
    | SessionClosed
    | SessionFailed
)
