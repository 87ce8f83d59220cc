"""Who is calling: the identity every authenticator produces."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["ANONYMOUS", "AUTHENTICATED", "UserInfo"]

AUTHENTICATED = "system:authenticated"


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
