"""Kubernetes WebSocket channel framing and subprotocol negotiation.

Owns the byte layout of the remote-command channel protocols
(`channel.k8s.io`, `v4.channel.k8s.io`, `v5.channel.k8s.io` and the base64
variants) and the raw KubeVirt-style framing, plus the choice of subprotocol
from what a client offers. Bytes in, events out; no I/O.
"""

from __future__ import annotations

import base64
import enum
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "BEARER_PREFIX",
    "CLOSE_SIGNAL",
    "ChannelClosed",
    "ChannelData",
    "ChannelError",
    "Dialect",
    "Framing",
    "TerminalSize",
    "bearer_token",
    "decode",
    "encode",
    "negotiate",
    "parse_resize",
    "without_bearer",
]

BEARER_PREFIX = "base64url.bearer.authorization.k8s.io."
CLOSE_SIGNAL = 0xFF
"""v5: a client message `[0xFF, channel]` closes that channel (stdin EOF)."""

STDIN, STDOUT, STDERR, ERROR, RESIZE = range(5)


class Framing(enum.Enum):
    """How one WebSocket message carries data."""

    RAW = "raw"
    BINARY = "binary"
    BASE64 = "base64"


@dataclass(frozen=True)
class Dialect:
    """A negotiated subprotocol: the name echoed to the client and its framing."""

    name: str
    framing: Framing
    close_signal: bool = False
    """v5: the client may close one channel with `[0xFF, channel]`."""
    status: bool = False
    """v4 and later: the error channel carries a `Status` JSON, also on success."""


DIALECTS: dict[str, Dialect] = {
    d.name: d
    for d in (
        Dialect("plain.kubevirt.io", Framing.RAW),
        Dialect("binary", Framing.RAW),
        Dialect("v5.channel.k8s.io", Framing.BINARY, close_signal=True, status=True),
        Dialect("v4.channel.k8s.io", Framing.BINARY, status=True),
        Dialect("channel.k8s.io", Framing.BINARY),
        Dialect("v4.base64.channel.k8s.io", Framing.BASE64, status=True),
        Dialect("base64.channel.k8s.io", Framing.BASE64),
    )
}
NO_SUBPROTOCOL = Dialect("", Framing.RAW)


class ChannelError(ValueError):
    """A message that does not follow the negotiated framing."""


@dataclass(frozen=True)
class ChannelData:
    """Bytes received on a channel (channel is 0 for raw framing)."""

    channel: int
    data: bytes


@dataclass(frozen=True)
class ChannelClosed:
    """The peer closed one channel (v5 close signal)."""

    channel: int


@dataclass(frozen=True)
class TerminalSize:
    """A resize message: columns and rows."""

    width: int
    height: int


def negotiate(offered: Sequence[str], supported: Iterable[str]) -> Dialect | None:
    """Pick the first offered subprotocol we support, in the client's order.

    No subprotocol offered means raw framing; offers that are all unsupported
    give None (the caller answers 400 listing what is supported).
    """
    allowed = set(supported)
    offers = [p for p in without_bearer(offered) if p]
    if not offers:
        return NO_SUBPROTOCOL if "" in allowed else None
    for name in offers:
        if name in allowed and name in DIALECTS:
            return DIALECTS[name]
    return None


def without_bearer(offered: Iterable[str]) -> list[str]:
    """The offered subprotocols minus the bearer-token pseudo-protocol."""
    return [p for p in offered if not p.startswith(BEARER_PREFIX)]


def bearer_token(offered: Iterable[str]) -> str | None:
    """The token carried in a `base64url.bearer.authorization.k8s.io.` offer."""
    for p in offered:
        if p.startswith(BEARER_PREFIX):
            encoded = p[len(BEARER_PREFIX) :]
            padded = encoded + "=" * (-len(encoded) % 4)
            try:
                token = base64.b64decode(padded, altchars=b"-_", validate=True).decode()
            except ValueError:  # bad base64, non-ASCII, or not UTF-8
                return None
            return token or None
    return None


def encode(dialect: Dialect, channel: int, data: bytes) -> bytes | str:
    """One message carrying `data` on `channel` (raw framing ignores the channel)."""
    if dialect.framing is Framing.RAW:
        return data
    if dialect.framing is Framing.BINARY:
        return bytes((channel,)) + data
    return chr(ord("0") + channel) + base64.b64encode(data).decode("ascii")


def decode(dialect: Dialect, message: bytes | str) -> ChannelData | ChannelClosed:
    """The event one client message carries."""
    if dialect.framing is Framing.RAW:
        return ChannelData(STDIN, message.encode() if isinstance(message, str) else message)
    if dialect.framing is Framing.BINARY:
        return _decode_binary(dialect, message.encode() if isinstance(message, str) else message)
    return _decode_base64(
        message.decode("ascii", "replace") if isinstance(message, bytes) else message
    )


def _decode_binary(dialect: Dialect, message: bytes) -> ChannelData | ChannelClosed:
    if not message:
        raise ChannelError("empty message has no channel byte")
    if message[0] == CLOSE_SIGNAL and dialect.close_signal:
        if len(message) != 2:
            raise ChannelError("close signal must name exactly one channel")
        return ChannelClosed(message[1])
    return ChannelData(message[0], message[1:])


def _decode_base64(message: str) -> ChannelData:
    if not message:
        raise ChannelError("empty message has no channel digit")
    channel = ord(message[0]) - ord("0")
    if not 0 <= channel <= 9:
        raise ChannelError(f"bad channel digit {message[0]!r}")
    try:
        return ChannelData(channel, base64.b64decode(message[1:], validate=True))
    except ValueError as exc:  # binascii.Error, or non-ASCII text
        raise ChannelError(f"bad base64 payload: {exc}") from None


def parse_resize(data: bytes) -> list[TerminalSize]:
    """Terminal sizes from a resize-channel payload.

    Clients send JSON objects `{"Width":W,"Height":H}` back to back, possibly
    several in one message.
    """
    decoder = json.JSONDecoder()
    text = data.decode("utf-8", "replace")
    sizes: list[TerminalSize] = []
    pos = 0
    while pos < len(text):
        if text[pos].isspace():
            pos += 1
            continue
        try:
            obj, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise ChannelError(f"bad resize message: {exc.msg}") from None
        sizes.append(_size(obj))
    return sizes


def _size(obj: object) -> TerminalSize:
    if not isinstance(obj, dict):
        raise ChannelError("resize message is not an object")
    return TerminalSize(_dimension(obj.get("Width")), _dimension(obj.get("Height")))


def _dimension(value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 0xFFFF:
        return value
    raise ChannelError("resize needs integer Width and Height in 0..65535")
