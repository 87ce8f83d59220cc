"""RMCP+ cipher suites and the keys of one session (IPMI v2.0, sections 13.28-13.33).

A `CipherSuite` names the authentication, integrity and confidentiality
algorithms a session proposes in its Open Session Request. `Keys` holds what
RAKP derives from the password and both random numbers (SIK, K1, K2) and
applies it to packets: HMAC-SHA1-96 AuthCodes (K1) and AES-CBC-128 payloads
(the first 16 bytes of K2). Only suites whose algorithms are all SHA1 or none
are offered: 0 (no security at all, refused unless an operator allows it), 1,
2 and 3. OpenIPMI's BMC refuses suite 17 (SHA256), so it could not be tested.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
from dataclasses import dataclass, field

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from subres.protocol.ipmi.errors import IntegrityError

__all__ = [
    "AES_BLOCK",
    "SUITES",
    "Auth",
    "CipherSuite",
    "Confidentiality",
    "Integrity",
    "Keys",
    "hmac_sha1",
]

AES_BLOCK = 16
AUTHCODE_SIZE = 12
"""HMAC-SHA1-96: the first 12 bytes of the HMAC."""


class Auth(enum.IntEnum):
    """Authentication algorithm numbers (table 13-17)."""

    NONE = 0
    HMAC_SHA1 = 1


class Integrity(enum.IntEnum):
    """Integrity algorithm numbers (table 13-18)."""

    NONE = 0
    HMAC_SHA1_96 = 1


class Confidentiality(enum.IntEnum):
    """Confidentiality algorithm numbers (table 13-19)."""

    NONE = 0
    AES_CBC_128 = 1


@dataclass(frozen=True)
class CipherSuite:
    """One cipher suite ID and its three algorithms (table 22-20)."""

    number: int
    auth: Auth
    integrity: Integrity
    confidentiality: Confidentiality


SUITES = {
    0: CipherSuite(0, Auth.NONE, Integrity.NONE, Confidentiality.NONE),
    1: CipherSuite(1, Auth.HMAC_SHA1, Integrity.NONE, Confidentiality.NONE),
    2: CipherSuite(2, Auth.HMAC_SHA1, Integrity.HMAC_SHA1_96, Confidentiality.NONE),
    3: CipherSuite(3, Auth.HMAC_SHA1, Integrity.HMAC_SHA1_96, Confidentiality.AES_CBC_128),
}
"""The suites this codec speaks, by number."""


def hmac_sha1(key: bytes, *parts: bytes) -> bytes:
    """HMAC-SHA1 of the concatenated `parts`."""
    return hmac.new(key, b"".join(parts), hashlib.sha1).digest()


@dataclass(frozen=True)
class Keys:
    """The session integrity key and what is derived from it (section 13.32)."""

    suite: CipherSuite
    sik: bytes = field(default=b"", repr=False)

    @property
    def k1(self) -> bytes:
        """The integrity key: HMAC_SIK(twenty 0x01 bytes)."""
        return hmac_sha1(self.sik, b"\x01" * 20)

    @property
    def k2(self) -> bytes:
        """The confidentiality key material: HMAC_SIK(twenty 0x02 bytes)."""
        return hmac_sha1(self.sik, b"\x02" * 20)

    @property
    def authenticated(self) -> bool:
        """Whether packets carry an AuthCode."""
        return self.suite.integrity is not Integrity.NONE

    @property
    def encrypted(self) -> bool:
        """Whether payloads are encrypted."""
        return self.suite.confidentiality is not Confidentiality.NONE

    def authcode(self, signed: bytes) -> bytes:
        """The AuthCode of `signed` (the session header through Next Header)."""
        return hmac_sha1(self.k1, signed)[:AUTHCODE_SIZE]

    def verify(self, signed: bytes, code: bytes) -> None:
        """`IntegrityError` unless `code` is the AuthCode of `signed`."""
        if not hmac.compare_digest(self.authcode(signed), code):
            raise IntegrityError("the packet's AuthCode does not match")

    def encrypt(self, payload: bytes, iv: bytes) -> bytes:
        """The confidentiality header (IV) and the padded, AES-CBC-128 encrypted payload."""
        pad = (-(len(payload) + 1)) % AES_BLOCK
        plain = payload + bytes(range(1, pad + 1)) + bytes([pad])
        encryptor = Cipher(algorithms.AES(self.k2[:16]), modes.CBC(iv)).encryptor()
        return iv + encryptor.update(plain) + encryptor.finalize()

    def decrypt(self, data: bytes) -> bytes:
        """The payload from an IV and AES-CBC-128 ciphertext; `IntegrityError` on bad padding."""
        body = data[AES_BLOCK:]
        if len(data) < 2 * AES_BLOCK or len(body) % AES_BLOCK:
            raise IntegrityError(f"an encrypted payload of {len(data)} bytes is not whole blocks")
        decryptor = Cipher(algorithms.AES(self.k2[:16]), modes.CBC(data[:AES_BLOCK])).decryptor()
        plain = decryptor.update(body) + decryptor.finalize()
        pad = plain[-1]
        if pad >= AES_BLOCK or plain[-1 - pad : -1] != bytes(range(1, pad + 1)):
            raise IntegrityError("the encrypted payload's padding is wrong")
        return plain[: -1 - pad]
