"""Authorization: may this user do what the request asks?

Order as kube-apiserver: `system:masters` first, then the always-allowed
non-resource paths, then the decision proper. In standalone mode the decision
proper is "any authenticated user"; behind a cluster it is a
SubjectAccessReview (`subres.auth.webhook`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from subres.auth.attributes import Attributes
from subres.auth.user import UserInfo

__all__ = ["ALWAYS_ALLOW_PATHS", "Decision", "StandaloneAuthorizer", "precheck"]

ALWAYS_ALLOW_PATHS = ("/healthz", "/livez", "/readyz")
MASTERS = "system:masters"


@dataclass(frozen=True)
class Decision:
    """An authorization answer; `reason` explains a denial."""

    allowed: bool
    reason: str = ""


def always_allowed(path: str, patterns: Sequence[str]) -> bool:
    """True when `path` matches a pattern (a trailing `*` matches a prefix)."""
    for pattern in patterns:
        if pattern.endswith("*"):
            if path.startswith(pattern[:-1]):
                return True
        elif path == pattern:
            return True
    return False


def precheck(
    user: UserInfo, attrs: Attributes, always_allow_paths: Sequence[str]
) -> Decision | None:
    """The answer given before asking anyone (masters, always-allowed paths), or None."""
    if MASTERS in user.groups:
        return Decision(True)
    if not attrs.resource_request and always_allowed(attrs.path, always_allow_paths):
        return Decision(True)
    return None


class StandaloneAuthorizer:
    """Allows every authenticated user; anonymous users reach only the allowed paths."""

    def __init__(self, always_allow_paths: Sequence[str] = ALWAYS_ALLOW_PATHS) -> None:
        self.always_allow_paths = tuple(always_allow_paths)

    async def authorize(self, user: UserInfo, attrs: Attributes) -> Decision:
        """The decision for `user` doing `attrs`."""
        early = precheck(user, attrs, self.always_allow_paths)
        if early is not None:
            return early
        if user.anonymous:
            return Decision(False, "anonymous requests are not allowed")
        return Decision(True)
