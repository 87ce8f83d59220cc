"""Who gets which session rules: per-role limits and moderation policies (`--config`).

`limits` are rules selected by user or group and by subresource (as RBAC
names them: `console`, `console-observe`, `vnc`, `vnc-observe`,
`portforward`, …) that set `maxSessionDuration`, `idleTimeout` (no input
from the client: what a writer types, an interactive viewer's keys and
pointer, a forward's or a USB redirection's bytes) and `maxSessionsPerUser`.
Every rule that matches a session applies, so the strictest wins
(`Limits.of`).

`moderation` policies select sessions by the parent's kind and labels, the
subresource and the user's groups, and say how many members of which
groups must watch (`moderators`) and what happens when they go
(`onLeave: pause | terminate`). The first policy that selects a session
applies (`Moderation.of`).

This module reads its own sections of the file (the loader in `config`
hands them over) and answers who-gets-what; it does no I/O.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ON_LEAVE",
    "Limit",
    "LimitRule",
    "Limits",
    "Moderation",
    "PolicyError",
    "parse_limits",
    "parse_moderation",
    "seconds",
]

ON_LEAVE = ("pause", "terminate")
_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?")


class PolicyError(ValueError):
    """A limits or moderation section is not valid; the message says where."""


@dataclass(frozen=True)
class LimitRule:
    """One rule of `limits`."""

    name: str
    """Named in the reason a session ends or is refused with."""
    users: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    """Whose sessions: any of these users or groups; both empty: everyone's."""
    subresources: tuple[str, ...] = ()
    """Which subresources (RBAC names); empty: all."""
    max_session_duration: float | None = None
    """Seconds a session may last."""
    idle_timeout: float | None = None
    """Seconds a session may go without input from its client."""
    max_sessions_per_user: int | None = None
    """Sessions a user may have open at once, of the subresources this rule selects."""

    def selects(self, user: str, groups: Sequence[str], subresource: str) -> bool:
        """Whether this rule applies to a session of `user` on `subresource`."""
        anyone = not self.users and not self.groups
        who = anyone or user in self.users or any(g in self.groups for g in groups)
        return who and (not self.subresources or subresource in self.subresources)


@dataclass(frozen=True)
class Limit:
    """One limit in force, and the rule that set it."""

    value: float
    rule: str


@dataclass(frozen=True)
class Limits:
    """What the rules allow one session: the strictest of each."""

    duration: Limit | None = None
    idle: Limit | None = None
    sessions: tuple[LimitRule, ...] = ()
    """The rules with a `maxSessionsPerUser` that select the session."""

    @classmethod
    def of(
        cls, rules: Sequence[LimitRule], *, user: str, groups: Sequence[str], subresource: str
    ) -> Limits:
        """The limits of a session of `user` on `subresource`."""
        matching = [r for r in rules if r.selects(user, groups, subresource)]
        return cls(
            duration=_strictest((r.max_session_duration, r.name) for r in matching),
            idle=_strictest((r.idle_timeout, r.name) for r in matching),
            sessions=tuple(r for r in matching if r.max_sessions_per_user is not None),
        )


def _strictest(values: Any) -> Limit | None:
    found = [Limit(value, name) for value, name in values if value is not None]
    return min(found, key=lambda limit: limit.value) if found else None


@dataclass(frozen=True)
class Moderation:
    """One policy of `moderation`: which sessions need moderators, and how many of whom."""

    name: str
    moderators: tuple[str, ...]
    """The groups whose members moderate."""
    count: int = 1
    """How many moderators must watch."""
    on_leave: str = "pause"
    """What happens when fewer watch: `pause` (input and output wait) or `terminate`."""
    kinds: tuple[str, ...] = ()
    """Parent kinds (`Machine`); empty: every kind."""
    labels: Mapping[str, str] | None = None
    """Labels the parent must carry; empty: any parent."""
    subresources: tuple[str, ...] = ("console", "vnc")
    """Which sessions: a console's writer, a display's interactive viewer."""
    groups: tuple[str, ...] = ()
    """Whose sessions: members of any of these groups; empty: everyone's."""

    def selects(
        self, obj: Mapping[str, Any], *, kind: str, subresource: str, groups: Sequence[str]
    ) -> bool:
        """Whether a session on `subresource` of the parent `obj` by a member of `groups`
        needs moderators under this policy."""
        if self.groups and not any(g in self.groups for g in groups):
            return False
        return self.covers(obj, kind=kind, subresource=subresource)

    def covers(self, obj: Mapping[str, Any], *, kind: str, subresource: str) -> bool:
        """Whether this policy may select sessions on `subresource` of the parent `obj`
        (whoever opens them): where its moderators may moderate."""
        if self.kinds and kind not in self.kinds:
            return False
        if subresource not in self.subresources:
            return False
        meta = obj.get("metadata")
        found = meta.get("labels") if isinstance(meta, Mapping) else None
        found = found if isinstance(found, Mapping) else {}
        return all(found.get(k) == v for k, v in (self.labels or {}).items())

    def may_moderate(self, groups: Sequence[str]) -> bool:
        """Whether a member of `groups` counts as a moderator."""
        return any(g in self.moderators for g in groups)

    @staticmethod
    def of(
        policies: Sequence[Moderation],
        obj: Mapping[str, Any],
        *,
        kind: str,
        subresource: str,
        groups: Sequence[str],
    ) -> Moderation | None:
        """The first policy that selects the session, if any."""
        return next(
            (
                p
                for p in policies
                if p.selects(obj, kind=kind, subresource=subresource, groups=groups)
            ),
            None,
        )


def seconds(value: Any, what: str) -> float:
    """A duration: a positive number of seconds, or a string like `90s`, `10m`, `1h30m`."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str) and value and (match := _DURATION.fullmatch(value)):
        hours, minutes, secs = (float(part or 0) for part in match.groups())
        number = hours * 3600 + minutes * 60 + secs
    else:
        raise PolicyError(f"{what} must be seconds or a duration like 90s, 10m, 1h30m")
    if not math.isfinite(number) or number <= 0:
        raise PolicyError(f"{what} must be a positive duration")
    return number


def parse_limits(data: Any) -> tuple[LimitRule, ...]:
    """The `limits` section: a list of rules."""
    keys = {
        "name",
        "users",
        "groups",
        "subresources",
        "maxSessionDuration",
        "idleTimeout",
        "maxSessionsPerUser",
    }
    rules = []
    for index, item in enumerate(_list(data, "limits")):
        what = f"limits[{index}]"
        doc = _mapping(item, what, keys)
        count = doc.get("maxSessionsPerUser")
        if count is not None and (
            isinstance(count, bool) or not isinstance(count, int) or count < 1
        ):
            raise PolicyError(f"{what}.maxSessionsPerUser must be a positive integer")
        rule = LimitRule(
            name=_text(doc.get("name", f"limits[{index}]"), f"{what}.name"),
            users=_names(doc.get("users", []), f"{what}.users"),
            groups=_names(doc.get("groups", []), f"{what}.groups"),
            subresources=_names(doc.get("subresources", []), f"{what}.subresources"),
            max_session_duration=_optional_seconds(doc, "maxSessionDuration", what),
            idle_timeout=_optional_seconds(doc, "idleTimeout", what),
            max_sessions_per_user=count,
        )
        if (rule.max_session_duration, rule.idle_timeout, count) == (None, None, None):
            raise PolicyError(f"{what} sets no limit")
        rules.append(rule)
    return tuple(rules)


def parse_moderation(data: Any) -> tuple[Moderation, ...]:
    """The `moderation` section: a list of policies."""
    keys = {"name", "kinds", "labels", "subresources", "groups", "moderators", "onLeave"}
    policies = []
    for index, item in enumerate(_list(data, "moderation")):
        what = f"moderation[{index}]"
        doc = _mapping(item, what, keys)
        moderators = _mapping(doc.get("moderators"), f"{what}.moderators", {"groups", "count"})
        count = moderators.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise PolicyError(f"{what}.moderators.count must be a positive integer")
        groups = _names(moderators.get("groups", []), f"{what}.moderators.groups")
        if not groups:
            raise PolicyError(f"{what}.moderators.groups must name at least one group")
        on_leave = doc.get("onLeave", "pause")
        if on_leave not in ON_LEAVE:
            raise PolicyError(f"{what}.onLeave must be one of {', '.join(ON_LEAVE)}")
        subresources = _names(doc.get("subresources", ["console", "vnc"]), f"{what}.subresources")
        if not subresources or not set(subresources) <= {"console", "vnc"}:
            raise PolicyError(f"{what}.subresources: console, vnc or both")
        labels = _mapping(doc.get("labels", {}), f"{what}.labels", None)
        policies.append(
            Moderation(
                name=_text(doc.get("name", what), f"{what}.name"),
                moderators=groups,
                count=count,
                on_leave=on_leave,
                kinds=_names(doc.get("kinds", []), f"{what}.kinds"),
                labels={
                    _text(k, f"{what}.labels"): _text(v, f"{what}.labels")
                    for k, v in labels.items()
                },
                subresources=subresources,
                groups=_names(doc.get("groups", []), f"{what}.groups"),
            )
        )
    return tuple(policies)


def _optional_seconds(doc: Mapping[str, Any], key: str, what: str) -> float | None:
    return seconds(doc[key], f"{what}.{key}") if key in doc else None


def _list(data: Any, what: str) -> list[Any]:
    if not isinstance(data, list):
        raise PolicyError(f"{what} must be a list")
    return data


def _mapping(data: Any, what: str, keys: set[str] | None) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise PolicyError(f"{what} must be a mapping")
    unknown = set(data) - keys if keys is not None else set()
    if unknown:
        raise PolicyError(f"{what}: unknown keys {sorted(map(str, unknown))}")
    return data


def _names(data: Any, what: str) -> tuple[str, ...]:
    return tuple(_text(item, what) for item in _list(data, what))


def _text(data: Any, what: str) -> str:
    if not isinstance(data, str) or not data:
        raise PolicyError(f"{what} must be a non-empty string")
    return data
