"""Authentication: from the credentials a request carries to a `UserInfo`.

Standalone mode knows two kinds of credential: a bearer token from the static
token file, and a client certificate issued by the client CA. Credentials
that are present but wrong fail the request (401); none at all give the
anonymous user, which only the always-allowed paths accept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.x509.oid import NameOID
from multidict import CIMultiDict, CIMultiDictProxy, MultiMapping

from subres.auth.cafile import CAFile
from subres.auth.tokenfile import TokenFile
from subres.auth.user import ANONYMOUS, UserInfo

__all__ = ["Authenticator", "Credentials", "Unauthenticated", "from_certificate"]


class Unauthenticated(Exception):
    """Credentials were presented and are not valid."""


@dataclass(frozen=True)
class Credentials:
    """What a request presented."""

    token: str | None = None
    certificate: x509.Certificate | None = None
    headers: MultiMapping[str] = field(default_factory=lambda: CIMultiDictProxy(CIMultiDict()))
    """The request headers (case-insensitive), where a front proxy names the user."""


class Authenticator:
    """Static tokens and client certificates."""

    def __init__(self, *, tokens: TokenFile | None = None, client_ca: CAFile | None = None) -> None:
        self.tokens = tokens
        self.client_ca = client_ca

    def reload_if_changed(self) -> None:
        """Follow changes to the token and CA files."""
        if self.tokens is not None:
            self.tokens.reload_if_changed()
        if self.client_ca is not None:
            self.client_ca.reload_if_changed()

    async def authenticate(self, creds: Credentials) -> UserInfo:
        """The caller's identity; raises `Unauthenticated` for bad credentials."""
        if creds.token is not None:
            user = self.tokens.lookup(creds.token) if self.tokens else None
            if user is None:
                raise Unauthenticated("invalid bearer token")
            return user.authenticated()
        if creds.certificate is not None:
            cas = self.client_ca.certificates if self.client_ca else ()
            user = from_certificate(creds.certificate, cas)
            if user is not None:
                return user.authenticated()
        return ANONYMOUS


def from_certificate(cert: x509.Certificate, cas: Sequence[x509.Certificate]) -> UserInfo | None:
    """CN as user and O as groups when one of `cas` issued `cert`; None otherwise."""
    # The TLS layer already verified the chain against every CA it trusts;
    # re-check that one of these issued it, since several CAs may be loaded.
    for ca in cas:
        try:
            cert.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature):
            continue
        name = _attrs(cert, NameOID.COMMON_NAME)
        if not name:
            raise Unauthenticated("client certificate has no common name")
        return UserInfo(name[0], groups=tuple(_attrs(cert, NameOID.ORGANIZATION_NAME)))
    return None


def _attrs(cert: x509.Certificate, oid: x509.ObjectIdentifier) -> list[str]:
    return [str(a.value) for a in cert.subject.get_attributes_for_oid(oid)]
