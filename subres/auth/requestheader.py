"""Front-proxy (request-header) authentication: identities kube-apiserver vouches for.

kube-apiserver proxies a request with its front-proxy client certificate and
names the user in `X-Remote-User`, `X-Remote-Group` and `X-Remote-Extra-*`
(the header names are configurable). Those headers are believed only when the
connection's leaf certificate verifies against the request-header CA alone
(the TLS layer also trusts the client CA and does not say which CA matched),
carries the client-auth usage and, if allowed names are configured, has
only allowed names as common names (CVE-2025-64432's class: the right CA,
another name).
"""

from __future__ import annotations

import datetime
import re
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from cryptography.x509.verification import (
    ExtensionPolicy,
    PolicyBuilder,
    Store,
    VerificationError,
)
from multidict import MultiMapping

from subres.auth.authn import Unauthenticated
from subres.auth.user import UserInfo

__all__ = ["FrontProxy", "RequestHeaderConfig", "unescape_extra_key"]

_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


@dataclass(frozen=True)
class RequestHeaderConfig:
    """Which proxy to believe and which headers carry the identity."""

    client_ca: tuple[x509.Certificate, ...] = ()
    """CAs that issue front-proxy client certificates; none disables front-proxy authentication."""
    allowed_names: tuple[str, ...] = ()
    """Common names a proxy certificate may have; empty allows any."""
    username_headers: tuple[str, ...] = ()
    """Headers naming the user, checked in order (e.g. `X-Remote-User`)."""
    uid_headers: tuple[str, ...] = ()
    """Headers carrying the user's uid, checked in order."""
    group_headers: tuple[str, ...] = ()
    """Headers whose every value is a group (e.g. `X-Remote-Group`)."""
    extra_headers_prefixes: tuple[str, ...] = ()
    """Header name prefixes of extra attributes (e.g. `X-Remote-Extra-`)."""


class FrontProxy:
    """Authenticates requests relayed by a trusted front proxy."""

    def __init__(self, config: RequestHeaderConfig) -> None:
        """Prepare the verifier; `config.client_ca` must not be empty."""
        self.config = config
        self._store = Store(list(config.client_ca))

    def authenticate(
        self, certificate: x509.Certificate, headers: MultiMapping[str]
    ) -> UserInfo | None:
        """The user the proxy names; None when it names none.

        Raises `Unauthenticated` when the certificate is not a trusted proxy's.
        `headers` must match names case-insensitively, as HTTP headers do.
        """
        self.verify(certificate)
        name = _first(headers, self.config.username_headers)
        if not name:
            return None
        return UserInfo(
            name,
            uid=_first(headers, self.config.uid_headers),
            groups=tuple(_every(headers, self.config.group_headers)),
            extra=_extra(headers, self.config.extra_headers_prefixes),
        )

    def verify(self, certificate: x509.Certificate) -> None:
        """Raise `Unauthenticated` unless `certificate` belongs to an allowed proxy."""
        # The Web PKI defaults reject typical proxy certificates (no SAN, no authority
        # key identifier), so the end-entity policy is relaxed and its usage checked here.
        verifier = (
            PolicyBuilder()
            .store(self._store)
            .time(datetime.datetime.now(datetime.UTC))
            .extension_policies(
                ca_policy=ExtensionPolicy.webpki_defaults_ca(),
                ee_policy=ExtensionPolicy.permit_all(),
            )
            .build_client_verifier()
        )
        try:
            verifier.verify(certificate, [])
        except VerificationError as exc:
            raise Unauthenticated(f"not signed by the request-header CA: {exc}") from None
        if not _client_auth(certificate):
            raise Unauthenticated("request-header certificate lacks the client-auth usage")
        allowed = self.config.allowed_names
        common_names = [
            str(a.value) for a in certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        ]
        # Every common name, not any one: kube-apiserver reads a subject's last CN, and a
        # certificate that also names an allowed proxy must not smuggle another in.
        if allowed and not (common_names and all(cn in allowed for cn in common_names)):
            raise Unauthenticated(
                f"request-header certificate common name {common_names} is not allowed"
            )


def unescape_extra_key(key: str) -> str:
    """The extra key an `X-Remote-Extra-` suffix encodes: lowercased, then percent-decoded.

    A suffix that is not valid percent-encoded UTF-8 is kept as it is, as Go's
    `url.PathUnescape` failing leaves it in kube-apiserver.
    """
    lowered = key.lower()
    if _ESCAPE.search(lowered):
        return lowered
    try:
        return urllib.parse.unquote(lowered, errors="strict")
    except UnicodeDecodeError:
        return lowered


def _client_auth(certificate: x509.Certificate) -> bool:
    try:
        usage = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return True  # no EKU extension allows every usage
    return ExtendedKeyUsageOID.CLIENT_AUTH in usage or (
        ExtendedKeyUsageOID.ANY_EXTENDED_KEY_USAGE in usage
    )


def _first(headers: MultiMapping[str], names: Sequence[str]) -> str:
    """The first value of the first named header that has a non-empty first value."""
    for name in names:
        value = headers.get(name, "")
        if value:
            return value
    return ""


def _every(headers: MultiMapping[str], names: Sequence[str]) -> list[str]:
    """Every non-empty value of every named header, one per header line."""
    return [v for name in names for v in headers.getall(name, ()) if v]


def _extra(headers: MultiMapping[str], prefixes: Sequence[str]) -> Mapping[str, tuple[str, ...]]:
    extra: dict[str, tuple[str, ...]] = {}
    for prefix in (p.lower() for p in prefixes):
        for header, value in headers.items():
            if header.lower().startswith(prefix) and len(header) > len(prefix):
                key = unescape_extra_key(header[len(prefix) :])
                extra[key] = (*extra.get(key, ()), value)
    return extra
