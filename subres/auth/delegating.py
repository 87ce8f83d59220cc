"""Authentication behind a cluster: front proxy, client certificate, bearer token.

Tried in kube-apiserver's order; the first that names a user wins. One that
does not apply (no certificate, no token, a proxy certificate naming no user)
is skipped; one that fails is remembered, and the request fails with 401 only
when nothing succeeded. No credentials at all is the anonymous user.
"""

from __future__ import annotations

from subres.auth import authn
from subres.auth.authconfig import AuthenticationSource
from subres.auth.authn import Credentials, Unauthenticated
from subres.auth.user import ANONYMOUS, UserInfo
from subres.auth.webhook import TokenReviewAuthenticator

__all__ = ["DelegatingAuthenticator"]


class DelegatingAuthenticator:
    """Identities from the cluster's front proxy, its client CA and its TokenReview API."""

    def __init__(self, *, config: AuthenticationSource, tokens: TokenReviewAuthenticator) -> None:
        self.config = config
        self.tokens = tokens

    async def authenticate(self, creds: Credentials) -> UserInfo:
        """The caller's identity; raises `Unauthenticated` when credentials fail."""
        failures: list[str] = []
        user = self._from_certificate(creds, failures)
        if user is None and creds.token is not None:
            try:
                user = await self.tokens.authenticate(creds.token)
            except Unauthenticated as exc:
                failures.append(str(exc))
        if user is not None:
            return user.authenticated()
        if failures:
            raise Unauthenticated("; ".join(failures))
        return ANONYMOUS

    def _from_certificate(self, creds: Credentials, failures: list[str]) -> UserInfo | None:
        cert = creds.certificate
        if cert is None:
            return None
        proxy = self.config.front_proxy
        if proxy is not None:
            try:
                user = proxy.authenticate(cert, creds.headers)
            except Unauthenticated as exc:
                failures.append(f"front proxy: {exc}")
            else:
                if user is not None:
                    return user
        try:
            user = authn.from_certificate(cert, self.config.client_ca)
        except Unauthenticated as exc:
            failures.append(str(exc))
            return None
        if user is None:
            failures.append("client certificate not issued by the client CA")
        return user
