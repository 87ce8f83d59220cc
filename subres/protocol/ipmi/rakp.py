"""RMCP+ session establishment: Open Session and RAKP messages 1-4 (sections 13.17-13.23).

The remote console proposes a cipher suite (Open Session Request), proves
the password (RAKP 1 and 3) and checks the BMC's proof (RAKP 2 and 4); both
sides derive the session integrity key (SIK) from the password, both random
numbers, the role and the user name. `Exchange` holds what one handshake
needs and checks each answer; a refusal becomes a `HandshakeError` naming the
BMC's RMCP+ status code, a reply that is not what the layouts allow a
`PacketError`.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field

from subres.protocol.ipmi.crypto import AUTHCODE_SIZE, Auth, CipherSuite, Keys, hmac_sha1
from subres.protocol.ipmi.errors import Fault, HandshakeError, PacketError

__all__ = ["MAX_USERNAME", "STATUS", "Exchange"]

MAX_USERNAME = 16
MAX_PASSWORD = 20
NAME_ONLY_LOOKUP = 0x10
"""RAKP 1's role bit 4: look the user up by name and privilege (as ipmitool does)."""

STATUS = {
    0x01: "insufficient resources to create a session",
    0x02: "invalid session ID",
    0x03: "invalid payload type",
    0x04: "invalid authentication algorithm",
    0x05: "invalid integrity algorithm",
    0x06: "no matching authentication payload",
    0x07: "no matching integrity payload",
    0x08: "inactive session ID",
    0x09: "invalid role",
    0x0A: "unauthorized role or privilege level requested",
    0x0B: "insufficient resources to create a session at the requested role",
    0x0C: "invalid name length",
    0x0D: "unauthorized name",
    0x0E: "unauthorized GUID",
    0x0F: "invalid integrity check value",
    0x10: "invalid confidentiality algorithm",
    0x11: "no cipher suite match with the proposed security algorithms",
    0x12: "illegal or unrecognized parameter",
}
"""RMCP+ status codes (table 13-15)."""
_CREDENTIALS = {0x0D, 0x0F}
_SUITE = {0x04, 0x05, 0x06, 0x07, 0x10, 0x11}


@dataclass(frozen=True)
class Exchange:
    """One handshake's fixed parts: who, with which suite, and this side's numbers."""

    username: bytes
    password: bytes = field(repr=False)
    suite: CipherSuite
    privilege: int
    console_id: int
    """Our session ID: the BMC addresses its packets to it."""
    console_random: bytes
    """Rm, 16 random bytes."""
    tag: int = 0

    def __post_init__(self) -> None:
        if len(self.username) > MAX_USERNAME or len(self.password) > MAX_PASSWORD:
            raise ValueError("IPMI user names have at most 16 bytes, passwords 20")

    @property
    def role(self) -> int:
        """RAKP 1's role byte, which every key exchange HMAC covers."""
        return self.privilege | NAME_ONLY_LOOKUP

    def open_request(self) -> bytes:
        """The Open Session Request payload."""
        head = bytes([self.tag, 0, 0, 0]) + self.console_id.to_bytes(4, "little")
        algorithms = (self.suite.auth, self.suite.integrity, self.suite.confidentiality)
        return head + b"".join(
            bytes([kind, 0, 0, 8, number, 0, 0, 0]) for kind, number in enumerate(algorithms)
        )

    def opened(self, payload: bytes) -> int:
        """The BMC's session ID from its Open Session Response."""
        self._status(payload, "Open Session Request")
        if len(payload) < 36 or int.from_bytes(payload[4:8], "little") != self.console_id:
            raise PacketError("an Open Session Response is short or for another session")
        return int.from_bytes(payload[8:12], "little")

    def rakp1(self, bmc_id: int) -> bytes:
        """RAKP Message 1: our random number, role and user name."""
        return (
            bytes([self.tag, 0, 0, 0])
            + bmc_id.to_bytes(4, "little")
            + self.console_random
            + bytes([self.role, 0, 0, len(self.username)])
            + self.username
        )

    def rakp2(self, payload: bytes, bmc_id: int) -> tuple[bytes, bytes]:
        """The BMC's random number and GUID from RAKP 2, once its HMAC proves the password."""
        self._status(payload, "RAKP Message 1")
        if len(payload) < 40 or int.from_bytes(payload[4:8], "little") != self.console_id:
            raise PacketError("a RAKP Message 2 is short or for another session")
        bmc_random, guid, code = payload[8:24], payload[24:40], payload[40:]
        if self.suite.auth is Auth.HMAC_SHA1:
            expected = hmac_sha1(
                self.password,
                self.console_id.to_bytes(4, "little"),
                bmc_id.to_bytes(4, "little"),
                self.console_random,
                bmc_random,
                guid,
                self._name(),
            )
            if not hmac.compare_digest(code, expected):
                raise HandshakeError(
                    "the BMC's RAKP Message 2 does not prove the password: wrong password",
                    Fault.CREDENTIALS,
                )
        return bmc_random, guid

    def rakp3(self, bmc_id: int, bmc_random: bytes) -> bytes:
        """RAKP Message 3: our proof of the password."""
        code = b""
        if self.suite.auth is Auth.HMAC_SHA1:
            code = hmac_sha1(
                self.password, bmc_random, self.console_id.to_bytes(4, "little"), self._name()
            )
        return bytes([self.tag, 0, 0, 0]) + bmc_id.to_bytes(4, "little") + code

    def keys(self, bmc_random: bytes) -> Keys:
        """The session's keys: SIK = HMAC_Kg(Rm | Rc | role | name), Kg being the password."""
        if self.suite.auth is Auth.NONE:
            return Keys(self.suite)
        sik = hmac_sha1(self.password, self.console_random, bmc_random, self._name())
        return Keys(self.suite, sik)

    def rakp4(self, payload: bytes, *, keys: Keys, bmc_id: int, guid: bytes) -> None:
        """Check RAKP 4's integrity check value: HMAC_SIK(Rm | SIDc | GUIDc), 96 bits."""
        self._status(payload, "RAKP Message 3")
        if len(payload) < 8 or int.from_bytes(payload[4:8], "little") != self.console_id:
            raise PacketError("a RAKP Message 4 is short or for another session")
        if self.suite.auth is Auth.NONE:
            return
        expected = hmac_sha1(keys.sik, self.console_random, bmc_id.to_bytes(4, "little"), guid)[
            :AUTHCODE_SIZE
        ]
        if not hmac.compare_digest(payload[8:], expected):
            raise HandshakeError("the BMC's RAKP Message 4 does not check out", Fault.PROTOCOL)

    def _name(self) -> bytes:
        return bytes([self.role, len(self.username)]) + self.username

    def _status(self, payload: bytes, answering: str) -> None:
        if len(payload) < 2 or payload[0] != self.tag:
            raise PacketError(f"the answer to {answering} is short or has another tag")
        status = payload[1]
        if status == 0:
            return
        what = STATUS.get(status, "an unknown status")
        fault = (
            Fault.CREDENTIALS
            if status in _CREDENTIALS
            else Fault.REFUSED
            if status in _SUITE or status in {0x09, 0x0A}
            else Fault.PROTOCOL
        )
        raise HandshakeError(f"the BMC refused {answering}: {what} ({status:#04x})", fault)
