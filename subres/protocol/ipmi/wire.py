"""Byte layouts of RMCP, the IPMI v1.5 and v2.0 (RMCP+) session headers, and IPMI messages.

Everything here is a pure function of bytes: building a datagram from a
payload and the session's keys, and parsing one back into a `Packet`. A
datagram that is not exactly what the layouts allow raises `PacketError`
(`IntegrityError` when its AuthCode or padding is wrong); nothing else
escapes, whatever the input.

    RMCP header (4)        06 00 ff 07             version, reserved, no ACK, class IPMI
    v1.5 session (10)      00 seq(4) id(4) len(1)  auth type none, for Get Channel Auth Caps
    v2.0 session (12)      06 type id(4) seq(4) len(2, LE)
    payload                [IV(16) + AES-CBC(payload + pad + pad length)] when encrypted
    integrity trailer      ff.. pad length 07 AuthCode(12)   when authenticated

Session IDs, sequence numbers and lengths are little-endian, as the spec says.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from subres.protocol.ipmi.crypto import AUTHCODE_SIZE, Keys
from subres.protocol.ipmi.errors import IntegrityError, PacketError

__all__ = [
    "ASF_PING",
    "BMC_ADDRESS",
    "CONSOLE_ADDRESS",
    "Message",
    "Packet",
    "PayloadType",
    "build",
    "build_v15",
    "checksum",
    "parse",
    "parse_message",
    "request",
]

RMCP_IPMI = b"\x06\x00\xff\x07"
RMCP_ASF = 0x06
AUTH_NONE = 0x00
AUTH_RMCPP = 0x06
NEXT_HEADER = 0x07
ENCRYPTED = 0x80
AUTHENTICATED = 0x40
BMC_ADDRESS = 0x20
CONSOLE_ADDRESS = 0x81
MAX_DATAGRAM = 1500
"""No IPMI packet is longer than an Ethernet frame; longer datagrams are refused unread."""

ASF_PING = bytes.fromhex("06 00 ff 06 000011be 80 00 00 00")
"""An RMCP/ASF Presence Ping (IANA 4542, message tag 0): answered by any BMC, session or not."""


class PayloadType(enum.IntEnum):
    """RMCP+ payload types (table 13-16)."""

    IPMI = 0x00
    SOL = 0x01
    OPEN_SESSION_REQUEST = 0x10
    OPEN_SESSION_RESPONSE = 0x11
    RAKP1 = 0x12
    RAKP2 = 0x13
    RAKP3 = 0x14
    RAKP4 = 0x15


@dataclass(frozen=True)
class Packet:
    """A parsed datagram: its session, its payload (decrypted) and how it was protected."""

    payload_type: PayloadType
    session_id: int
    sequence: int
    payload: bytes
    authenticated: bool = False
    encrypted: bool = False
    v15: bool = False


@dataclass(frozen=True)
class Message:
    """An IPMI response (or request) message in the LAN format (section 13.8)."""

    netfn: int
    command: int
    sequence: int
    data: bytes
    """For a response: the completion code, then the response data."""

    @property
    def completion(self) -> int:
        """A response's completion code (0 is success)."""
        return self.data[0] if self.data else 0xFF


def checksum(data: bytes) -> int:
    """The two's complement checksum IPMI messages carry."""
    return -sum(data) & 0xFF


def request(*, netfn: int, command: int, sequence: int, data: bytes = b"") -> bytes:
    """An IPMI request from the remote console (SWID 0x81) to the BMC (0x20), LUN 0."""
    head = bytes([BMC_ADDRESS, netfn << 2])
    body = bytes([CONSOLE_ADDRESS, (sequence & 0x3F) << 2, command]) + data
    return head + bytes([checksum(head)]) + body + bytes([checksum(body)])


def parse_message(data: bytes) -> Message:
    """An IPMI message in the LAN format; `PacketError` if short or its checksums fail."""
    if len(data) < 7:
        raise PacketError(f"an IPMI message of {len(data)} bytes is too short")
    if checksum(data[:2]) != data[2] or checksum(data[3:-1]) != data[-1]:
        raise PacketError("an IPMI message's checksum is wrong")
    return Message(netfn=data[1] >> 2, command=data[5], sequence=data[4] >> 2, data=data[6:-1])


def build_v15(payload: bytes) -> bytes:
    """An IPMI v1.5 packet outside any session (Get Channel Authentication Capabilities)."""
    return RMCP_IPMI + bytes([AUTH_NONE]) + bytes(8) + bytes([len(payload)]) + payload


def build(
    payload_type: PayloadType,
    payload: bytes,
    *,
    session_id: int = 0,
    sequence: int = 0,
    keys: Keys | None = None,
    iv: bytes = b"",
) -> bytes:
    """An RMCP+ datagram; with `keys` (an open session), encrypted and signed as they say."""
    flags = 0
    if keys is not None and keys.encrypted:
        payload = keys.encrypt(payload, iv)
        flags |= ENCRYPTED
    if keys is not None and keys.authenticated:
        flags |= AUTHENTICATED
    header = bytes([AUTH_RMCPP, flags | payload_type]) + _u32(session_id) + _u32(sequence)
    signed = header + len(payload).to_bytes(2, "little") + payload
    if keys is None or not keys.authenticated:
        return RMCP_IPMI + signed
    pad = (-(len(signed) + 2)) % 4
    signed += b"\xff" * pad + bytes([pad, NEXT_HEADER])
    return RMCP_IPMI + signed + keys.authcode(signed)


def parse(datagram: bytes, keys: Keys | None = None) -> Packet:
    """A `Packet` from one datagram, checked and decrypted with `keys` when it is protected.

    A protected packet without `keys` (no session yet) is a `PacketError`.
    """
    if len(datagram) > MAX_DATAGRAM:
        raise PacketError(f"a datagram of {len(datagram)} bytes is larger than any IPMI packet")
    if len(datagram) < 5 or datagram[:4] != RMCP_IPMI:
        raise PacketError("not an RMCP packet of class IPMI")
    if datagram[4] == AUTH_NONE:
        return _parse_v15(datagram[4:])
    if datagram[4] != AUTH_RMCPP:
        raise PacketError(f"IPMI authentication type {datagram[4]:#x} is not spoken here")
    return _parse_v20(datagram[4:], keys)


def _parse_v15(session: bytes) -> Packet:
    if len(session) < 10 or len(session) != 10 + session[9]:
        raise PacketError("an IPMI v1.5 packet's length is wrong")
    return Packet(
        PayloadType.IPMI,
        session_id=int.from_bytes(session[5:9], "little"),
        sequence=int.from_bytes(session[1:5], "little"),
        payload=session[10:],
        v15=True,
    )


def _parse_v20(session: bytes, keys: Keys | None) -> Packet:
    if len(session) < 12:
        raise PacketError("an RMCP+ session header is short")
    flags = session[1]
    try:
        payload_type = PayloadType(flags & 0x3F)
    except ValueError:
        raise PacketError(f"RMCP+ payload type {flags & 0x3F:#x} is not spoken here") from None
    length = int.from_bytes(session[10:12], "little")
    end = 12 + length
    if end > len(session):
        raise PacketError("an RMCP+ payload is longer than its datagram")
    authenticated, encrypted = bool(flags & AUTHENTICATED), bool(flags & ENCRYPTED)
    if not (authenticated or encrypted):
        if end != len(session):
            raise PacketError("an unauthenticated RMCP+ packet has trailing bytes")
        payload = session[12:end]
    elif keys is None:
        raise PacketError("a protected packet arrived outside a session")
    else:
        payload = _unprotect(session, end, keys, authenticated=authenticated, encrypted=encrypted)
    return Packet(
        payload_type,
        session_id=int.from_bytes(session[2:6], "little"),
        sequence=int.from_bytes(session[6:10], "little"),
        payload=payload,
        authenticated=authenticated,
        encrypted=encrypted,
    )


def _unprotect(
    session: bytes, end: int, keys: Keys, *, authenticated: bool, encrypted: bool
) -> bytes:
    """The payload ending at `end`, its AuthCode checked and decrypted as the flags say."""
    if authenticated:
        _check_trailer(session, end, keys)
    elif end != len(session):
        raise PacketError("an unauthenticated RMCP+ packet has trailing bytes")
    payload = session[12:end]
    return keys.decrypt(payload) if encrypted else payload


def _check_trailer(session: bytes, end: int, keys: Keys) -> None:
    """The integrity pad, pad length, next header and AuthCode after the payload at `end`."""
    if len(session) < end + 2 + AUTHCODE_SIZE:
        raise IntegrityError("an authenticated packet has no room for its AuthCode")
    signed, code = session[:-AUTHCODE_SIZE], session[-AUTHCODE_SIZE:]
    pad = signed[-2]
    if signed[-1] != NEXT_HEADER or len(signed) != end + pad + 2 or len(signed) % 4:
        raise IntegrityError("an authenticated packet's integrity trailer is malformed")
    keys.verify(signed, code)


def _u32(value: int) -> bytes:
    return (value & 0xFFFFFFFF).to_bytes(4, "little")
