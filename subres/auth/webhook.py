"""Delegated decisions: bearer tokens by TokenReview, permissions by SubjectAccessReview.

Both ask the main apiserver, as sample-apiserver and metrics-server do, and
cache its answers briefly: a token's verdict (valid or not) for 10 s, an
authorization's allowed and denied verdicts for 10 s each by default. An
error getting a verdict is never cached. Identical lookups already in flight
are shared, so N concurrent requests with one token cost one TokenReview.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from subres.auth import authz
from subres.auth.attributes import Attributes
from subres.auth.authn import Unauthenticated
from subres.auth.authz import Decision
from subres.auth.ttlcache import Coalescer, TTLCache
from subres.auth.user import UserInfo
from subres.kube.client import Api, ApiError
from subres.kube.status import StatusError

__all__ = [
    "AuthorizerSettings",
    "TokenReviewAuthenticator",
    "TokenReviewSettings",
    "WebhookAuthorizer",
    "review_spec",
]

Clock = Callable[[], float]


@dataclass(frozen=True)
class TokenReviewSettings:
    """How bearer tokens are reviewed and their verdicts cached."""

    success_ttl: float = 10.0
    """Seconds a valid token's identity is reused (`--authentication-token-webhook-cache-ttl`)."""
    failure_ttl: float = 10.0
    """Seconds an invalid token stays rejected without asking again."""
    timeout: float = 10.0
    """Seconds one TokenReview may take."""
    max_entries: int = 4096
    """Tokens remembered at most."""


@dataclass(frozen=True)
class AuthorizerSettings:
    """How SubjectAccessReviews are asked and their verdicts cached."""

    allowed_ttl: float = 10.0
    """Seconds an allowed verdict is reused (`--authorization-webhook-cache-authorized-ttl`)."""
    denied_ttl: float = 10.0
    """Seconds a denied verdict is reused (`--authorization-webhook-cache-unauthorized-ttl`)."""
    timeout: float = 10.0
    """Seconds one SubjectAccessReview may take."""
    max_entries: int = 8192
    """Verdicts remembered at most."""
    always_allow_paths: tuple[str, ...] = authz.ALWAYS_ALLOW_PATHS
    """Non-resource paths anyone may reach (a trailing `*` matches a prefix)."""


@dataclass(frozen=True)
class _Verdict:
    user: UserInfo | None
    reason: str


class TokenReviewAuthenticator:
    """Bearer tokens checked by the main apiserver's TokenReview API."""

    def __init__(
        self, api: Api, settings: TokenReviewSettings, *, clock: Clock = time.monotonic
    ) -> None:
        self._api = api
        self._settings = settings
        self._cache: TTLCache[bytes, _Verdict] = TTLCache(
            max_entries=settings.max_entries, clock=clock
        )
        self._inflight: Coalescer[bytes, _Verdict] = Coalescer()
        # Tokens are keyed by a keyed hash: the cache never holds a usable credential.
        self._salt = os.urandom(32)

    @property
    def cache(self) -> TTLCache[bytes, _Verdict]:
        """The verdict cache (its hit and miss counts are metrics)."""
        return self._cache

    async def authenticate(self, token: str) -> UserInfo:
        """The token's user (without `system:authenticated`); raises `Unauthenticated`."""
        key = hmac.new(self._salt, token.encode(), hashlib.sha256).digest()
        verdict = self._cache.get(key)
        if verdict is None:
            verdict = await self._inflight.run(key, lambda: self._review(key, token))
        if verdict.user is None:
            raise Unauthenticated(verdict.reason)
        return verdict.user

    async def _review(self, key: bytes, token: str) -> _Verdict:
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token},
        }
        try:
            review = await self._api.create_token_review(
                body, request_timeout=self._settings.timeout
            )
        except ApiError as exc:
            raise Unauthenticated(f"token review failed: {exc}") from None
        verdict = _token_verdict(_object(review.get("status")))
        ttl = self._settings.success_ttl if verdict.user else self._settings.failure_ttl
        self._cache.put(key, verdict, ttl=ttl)
        return verdict


def _token_verdict(status: dict[str, Any]) -> _Verdict:
    if not status.get("authenticated"):
        error = status.get("error")
        return _Verdict(None, f"invalid bearer token{f': {error}' if error else ''}")
    user = _object(status.get("user"))
    name = str(user.get("username") or "")
    if not name:
        return _Verdict(None, "token review named no user")
    extra = _object(user.get("extra"))
    return _Verdict(
        UserInfo(
            name,
            uid=str(user.get("uid") or ""),
            groups=tuple(str(g) for g in user.get("groups") or ()),
            extra={str(k): tuple(str(v) for v in vs or ()) for k, vs in extra.items()},
        ),
        "",
    )


class WebhookAuthorizer:
    """Masters and always-allowed paths first, then the main apiserver's verdict."""

    def __init__(
        self, api: Api, settings: AuthorizerSettings, *, clock: Clock = time.monotonic
    ) -> None:
        self._api = api
        self._settings = settings
        self._cache: TTLCache[str, Decision] = TTLCache(
            max_entries=settings.max_entries, clock=clock
        )
        self._inflight: Coalescer[str, Decision] = Coalescer()

    @property
    def cache(self) -> TTLCache[str, Decision]:
        """The decision cache (its hit and miss counts are metrics)."""
        return self._cache

    async def authorize(self, user: UserInfo, attrs: Attributes) -> Decision:
        """The decision; raises a 500 `StatusError` when no verdict could be had."""
        early = authz.precheck(user, attrs, self._settings.always_allow_paths)
        if early is not None:
            return early
        spec = review_spec(user, attrs)
        key = json.dumps(spec, sort_keys=True)
        decision = self._cache.get(key)
        if decision is None:
            decision = await self._inflight.run(key, lambda: self._review(key, spec))
        return decision

    async def _review(self, key: str, spec: Mapping[str, Any]) -> Decision:
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": spec,
        }
        try:
            review = await self._api.create_subject_access_review(
                body, request_timeout=self._settings.timeout
            )
        except ApiError as exc:
            raise StatusError(500, f"authorization could not be checked: {exc}") from None
        status = _object(review.get("status"))
        decision = Decision(bool(status.get("allowed")), str(status.get("reason") or ""))
        s = self._settings
        self._cache.put(key, decision, ttl=s.allowed_ttl if decision.allowed else s.denied_ttl)
        return decision


def review_spec(user: UserInfo, attrs: Attributes) -> dict[str, Any]:
    """The SubjectAccessReview `spec` for `user` doing `attrs`."""
    spec: dict[str, Any] = {
        "user": user.name,
        "groups": list(user.groups),
        "extra": {k: list(v) for k, v in user.extra.items()},
    }
    if user.uid:
        spec["uid"] = user.uid
    if attrs.resource_request:
        spec["resourceAttributes"] = _without_empty(
            {
                "namespace": attrs.namespace,
                "verb": attrs.verb,
                "group": attrs.group,
                "version": attrs.version,
                "resource": attrs.resource,
                "subresource": attrs.subresource,
                "name": attrs.name,
            }
        )
    else:
        spec["nonResourceAttributes"] = {"path": attrs.path, "verb": attrs.verb}
    return spec


def _object(value: Any) -> dict[str, Any]:
    """`value` if it is a JSON object, else an empty one (absent fields read as unset)."""
    return value if isinstance(value, dict) else {}


def _without_empty(fields: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in fields.items() if v}
