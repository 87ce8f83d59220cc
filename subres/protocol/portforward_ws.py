"""Port-forward over a Kubernetes channel WebSocket (`…/portforward?ports=…`), as kubelet speaks it.

Owns the wire rules of that dialect: which subprotocols it accepts (none
offered means binary framing), how the `ports` query parameter is read, which
channels belong to which port (data 2i, error 2i+1), the first message the
server sends on each of them (the channel byte, then the port as a
little-endian u16), and how client messages map back to ports. Bytes in,
events out; no I/O.
"""

from __future__ import annotations

import base64
import binascii
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from subres.protocol import channels, digits
from subres.protocol.channels import Dialect, Framing

__all__ = [
    "DIALECTS",
    "MAX_PORTS",
    "PortData",
    "PortsError",
    "data_channel",
    "data_message",
    "decode",
    "error_channel",
    "error_message",
    "hello",
    "negotiate",
    "parse_ports",
]

MAX_PORTS = 100
"""Ports one WebSocket may name: channels are one byte (base64: one character from '0')."""

DIALECTS: dict[str, Dialect] = {
    d.name: d
    for d in (
        Dialect("", Framing.BINARY),
        Dialect("v4.channel.k8s.io", Framing.BINARY),
        Dialect("v4.base64.channel.k8s.io", Framing.BASE64),
    )
}
"""kubelet's three: no subprotocol is binary framing, not raw."""


class PortsError(ValueError):
    """The `ports` query parameter cannot be used; the message says why (answered 400)."""


@dataclass(frozen=True)
class PortData:
    """Bytes the client sent for the port at `index` in the `ports` list."""

    index: int
    data: bytes


def negotiate(offered: Sequence[str]) -> Dialect | None:
    """The first offered subprotocol kubelet supports; none offered is binary; else None."""
    offers = [p for p in channels.without_bearer(offered) if p]
    if not offers:
        return DIALECTS[""]
    for name in offers:
        if name in DIALECTS:
            return DIALECTS[name]
    return None


def parse_ports(values: Iterable[str]) -> tuple[int, ...]:
    """Ports from the `ports` parameters, each repeated or comma-separated; kubelet's rules."""
    ports: list[int] = []
    for value in values:
        if not value:
            raise PortsError('query parameter "ports" cannot be empty')
        ports.extend(_port(value, text) for text in value.split(","))
    if not ports:
        raise PortsError('query parameter "ports" is required')
    if len(ports) > MAX_PORTS:
        raise PortsError(f"at most {MAX_PORTS} ports may share one WebSocket, got {len(ports)}")
    return tuple(ports)


def _port(value: str, text: str) -> int:
    # Go's ParseUint takes plain ASCII digits only: no sign, no spaces, no underscores.
    if not digits.plain(text):
        raise PortsError(f"unable to parse {value!r} as a port")
    port = digits.value(text, cap=0xFFFF)
    if port > 0xFFFF:
        raise PortsError(f"unable to parse {value!r} as a port: out of range")
    if port < 1:
        raise PortsError(f"port {value!r} must be > 0")
    return port


def data_channel(index: int) -> int:
    """The channel carrying the bytes of the port at `index`."""
    return 2 * index


def error_channel(index: int) -> int:
    """The channel on which the server reports the failure of the port at `index`."""
    return 2 * index + 1


def hello(dialect: Dialect, ports: Sequence[int]) -> list[bytes | str]:
    """The server's first messages: each port's data then error channel, naming the port."""
    messages: list[bytes | str] = []
    for index, port in enumerate(ports):
        prefix = struct.pack("<H", port)
        messages.append(channels.encode(dialect, data_channel(index), prefix))
        messages.append(channels.encode(dialect, error_channel(index), prefix))
    return messages


def data_message(dialect: Dialect, index: int, data: bytes) -> bytes | str:
    """`data` for the port at `index` (either direction uses this framing)."""
    return channels.encode(dialect, data_channel(index), data)


def error_message(dialect: Dialect, index: int, text: str) -> bytes | str:
    """A failure of the port at `index`, as the plain text kubelet writes."""
    return channels.encode(dialect, error_channel(index), text.encode())


def decode(dialect: Dialect, message: bytes | str, *, port_count: int) -> PortData | None:
    """The port data a client message carries, or None for what kubelet ignores.

    kubelet skips empty messages, messages for channels beyond the ports, and
    messages on error channels (they are write-only). A payload that is not
    base64 in the base64 dialect raises `channels.ChannelError`.
    """
    if not message:
        return None
    payload: bytes | str
    if dialect.framing is Framing.BINARY:
        raw = message.encode() if isinstance(message, str) else message
        channel, payload = raw[0], raw[1:]
    else:
        text = message.decode("latin-1") if isinstance(message, bytes) else message
        channel, payload = ord(text[0]) - ord("0"), text[1:]
    if channel < 0 or channel >= 2 * port_count or channel % 2:
        return None
    if isinstance(payload, str):
        payload = _b64decode(payload)
    return PortData(channel // 2, payload)


def _b64decode(text: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (UnicodeEncodeError, binascii.Error) as exc:
        raise channels.ChannelError(f"bad base64 payload: {exc}") from None
