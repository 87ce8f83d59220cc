"""Per-role limits in force: how many sessions a user may open, how long one lasts, how idle.

`admit` runs before a session's upgrade: the rules (`policies.Limits`)
that select it are found, and a user already at a rule's
`maxSessionsPerUser` (counting the sessions that the same rule selects, on
every replica: the server asks the others when a rule has such a limit) is
refused with 429. Once live, `Watch` ends the session when it reaches its
`maxSessionDuration` (close code 4004) or goes `idleTimeout` without input
from its client (4005), each with a reason naming the rule, which the
client, the audit line and the Event all see. `headers` tell a client that
cares (the CLI) what is in force, so that it can say how long is left.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from subres.engine.websocket import CloseCode
from subres.kube.status import StatusError
from subres.policies import Limit, LimitRule, Limits
from subres.serving.units import human_age

__all__ = [
    "DURATION_HEADER",
    "IDLE_HEADER",
    "Counted",
    "Session",
    "Watch",
    "admit",
    "headers",
    "rbac_name",
]

DURATION_HEADER = "Subres-Session-Seconds-Left"
"""Seconds the session may last from its upgrade, when a rule limits them."""
IDLE_HEADER = "Subres-Idle-Timeout"
"""Seconds without input after which the session ends, when a rule limits them."""
SUFFIXES = {"observer": "-observe", "moderator": "-moderate"}


class Session(Protocol):
    """What `admit` needs of a live session: whose, and of what."""

    @property
    def user(self) -> str: ...
    @property
    def rbac(self) -> str: ...


@dataclass(frozen=True)
class Counted:
    """A session another replica fronts, as `admit` counts it."""

    user: str
    rbac: str


def rbac_name(subresource: str, mode: str) -> str:
    """The subresource as RBAC names it: `console-observe` for a console's observer."""
    return subresource + SUFFIXES.get(mode, "")


def admit(
    rules: Iterable[LimitRule],
    *,
    user: str,
    groups: tuple[str, ...],
    subresource: str,
    live: Iterable[Session],
) -> Limits:
    """The limits of a new session, or 429 when the user has as many as a rule allows."""
    limits = Limits.of(tuple(rules), user=user, groups=groups, subresource=subresource)
    if not limits.sessions:
        return limits
    mine = [s.rbac for s in live if s.user == user]
    for rule in sorted(limits.sessions, key=lambda r: r.max_sessions_per_user or 0):
        count = sum(1 for name in mine if rule.selects(user, groups, name))
        if rule.max_sessions_per_user is not None and count >= rule.max_sessions_per_user:
            what = ", ".join(rule.subresources) or "subres"
            raise StatusError(
                429,
                f"{user} already has {count} {what} sessions open, the most the limit "
                f"{rule.name} allows; close one first",
            )
    return limits


def headers(limits: Limits) -> dict[str, str]:
    """What the upgrade's answer says of the limits in force."""
    out = {}
    if limits.duration is not None:
        out[DURATION_HEADER] = f"{limits.duration.value:g}"
    if limits.idle is not None:
        out[IDLE_HEADER] = f"{limits.idle.value:g}"
    return out


Closer = Callable[[int, str], None]


class Watch:
    """The timers of one live session's limits; `stop` when it ends.

    `last_input` says when the client last gave input (`time.monotonic()`);
    None: the session takes none (an observer), and is never idle.
    """

    def __init__(
        self,
        limits: Limits,
        *,
        close: Closer,
        last_input: Callable[[], float] | None,
    ) -> None:
        self._limits = limits
        self._close = close
        self._last_input = last_input
        loop = asyncio.get_running_loop()
        self._deadline: asyncio.TimerHandle | None = None
        self._idle: asyncio.TimerHandle | None = None
        if limits.duration is not None:
            self._deadline = loop.call_later(limits.duration.value, self._expired)
        if limits.idle is not None and last_input is not None:
            self._idle = loop.call_later(limits.idle.value, self._idle_check)

    def _expired(self) -> None:
        limit = self._limits.duration
        assert limit is not None
        self._close(
            CloseCode.MAX_DURATION,
            f"the session reached its maximum duration of {_span(limit)} (limit {limit.rule})",
        )

    def _idle_check(self) -> None:
        limit, last_input = self._limits.idle, self._last_input
        assert limit is not None and last_input is not None
        quiet = time.monotonic() - last_input()
        if quiet >= limit.value:
            self._close(
                CloseCode.IDLE,
                f"no input for {_span(limit)}: the session's idle timeout (limit {limit.rule})",
            )
            return
        # Checked again when the quiet time could first reach the limit.
        self._idle = asyncio.get_running_loop().call_later(limit.value - quiet, self._idle_check)

    def stop(self) -> None:
        """The session ended."""
        for handle in (self._deadline, self._idle):
            if handle is not None:
                handle.cancel()


def _span(limit: Limit) -> str:
    return human_age(limit.value)
