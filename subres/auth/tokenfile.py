"""Static bearer tokens in kube-apiserver's `--token-auth-file` format.

Each line is `token,user,uid[,"group1,group2"]`; further columns are ignored,
as kube-apiserver does. The file is re-read when it changes.
"""

from __future__ import annotations

import csv
import hmac
import io
import logging
import os
from pathlib import Path

from subres.auth.user import UserInfo

__all__ = ["TokenFile", "TokenFileError", "parse"]

log = logging.getLogger(__name__)


class TokenFileError(ValueError):
    """A line of the token file is malformed."""


def parse(text: str) -> dict[str, UserInfo]:
    """Users by token."""
    users: dict[str, UserInfo] = {}
    for number, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        if not row or row[0].startswith("#"):
            continue
        if len(row) < 3 or not row[0] or not row[1]:
            raise TokenFileError(f"line {number}: need at least token,user,uid")
        groups = tuple(g.strip() for g in row[3].split(",") if g.strip()) if len(row) > 3 else ()
        users[row[0]] = UserInfo(row[1], row[2], groups)
    return users


class TokenFile:
    """Looks tokens up in a file that may change while the server runs."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._users: dict[str, UserInfo] = {}
        self._stamp: tuple[int, int, int] | None = None
        self.reload_if_changed(strict=True)

    def reload_if_changed(self, *, strict: bool = False) -> bool:
        """Re-read the file if it changed; a broken file keeps the old tokens (unless strict)."""
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
            if stamp == self._stamp:
                return False
            self._users = parse(self.path.read_text())
        except (OSError, TokenFileError) as exc:
            if strict:
                raise TokenFileError(f"{self.path}: {exc}") from None
            log.warning("token file %s not reloaded: %s", self.path, exc)
            return False
        self._stamp = stamp
        return True

    def lookup(self, token: str) -> UserInfo | None:
        """The user a token belongs to, compared in constant time."""
        for known, user in self._users.items():
            if hmac.compare_digest(known.encode(), token.encode()):
                return user
        return None
