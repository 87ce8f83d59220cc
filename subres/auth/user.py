"""Who is calling: the identity every authenticator produces, and its one form on the wire.

Between replicas a user crosses whole (name, uid, every group, extra) as
one value: canonical JSON (keys sorted, no spaces), base64url without
padding (`encode`, `decode`). One value rather than a header per group,
because headers travel through mappings that keep one value per name: a
user whose groups were cut to their last (`system:authenticated`) escaped
the moderation policies that select by group.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ANONYMOUS", "AUTHENTICATED", "MAX_ENCODED", "UserInfo", "decode", "encode"]

AUTHENTICATED = "system:authenticated"
MAX_ENCODED = 64 << 10
"""The longest encoded user `decode` reads (a header of that size is far past any real one)."""


@dataclass(frozen=True)
class UserInfo:
    """A user name, uid, groups and extra attributes, as Kubernetes has them."""

    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def anonymous(self) -> bool:
        """True for the identity of a caller with no credentials."""
        return self.name == ANONYMOUS.name

    def authenticated(self) -> UserInfo:
        """This user with `system:authenticated` added, as every real identity has it."""
        if AUTHENTICATED in self.groups:
            return self
        return UserInfo(self.name, self.uid, (*self.groups, AUTHENTICATED), self.extra)


ANONYMOUS = UserInfo("system:anonymous", groups=("system:unauthenticated",))


def encode(user: UserInfo) -> str:
    """`user` as one header-safe value: base64url of its canonical JSON, unpadded."""
    document = {
        "name": user.name,
        "uid": user.uid,
        "groups": list(user.groups),
        "extra": {key: list(values) for key, values in user.extra.items()},
    }
    text = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return base64.urlsafe_b64encode(text.encode()).rstrip(b"=").decode()


def decode(value: str) -> UserInfo:
    """The user `encode` made `value` from (ValueError, saying why, for anything else)."""
    if len(value) > MAX_ENCODED:
        raise ValueError(f"an encoded user is at most {MAX_ENCODED} characters")
    try:
        raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
        document = json.loads(raw)
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise ValueError("the user is not base64url of JSON") from None
    if not isinstance(document, dict) or set(document) != {"name", "uid", "groups", "extra"}:
        raise ValueError("the user must have exactly name, uid, groups and extra")
    name, uid = document["name"], document["uid"]
    if not isinstance(name, str) or not name or not isinstance(uid, str):
        raise ValueError("the user's name must be a non-empty string and its uid a string")
    extra = document["extra"]
    if not isinstance(extra, dict):
        raise ValueError("the user's extra must be a mapping of lists of strings")
    return UserInfo(
        name,
        uid,
        _strings(document["groups"], "groups"),
        {key: _strings(values, f"extra {key!r}") for key, values in extra.items()},
    )


def _strings(values: Any, what: str) -> tuple[str, ...]:
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise ValueError(f"the user's {what} must be a list of strings")
    return tuple(values)
