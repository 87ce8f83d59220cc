"""Admitting a new session under the per-role limits, counting its user's sessions everywhere.

`session.admit` decides from the sessions this replica fronts; when a rule
with `maxSessionsPerUser` selects the new session and other replicas are
members, their sessions of the same user are asked for first
(`sessionlist.elsewhere`, the peer port's list narrowed to the user), so
that a user spread over replicas is held to the same count. A replica that
does not answer is not counted (a limit of resources, not of access: it
fails open, and the log says which replica).
"""

from __future__ import annotations

from subres.policies import Limits
from subres.server import sessionlist
from subres.server.state import State
from subres.sessions import session
from subres.sessions.modes import Mode
from subres.sessions.runtime import Who
from subres.sessions.target import Target

__all__ = ["admit"]


async def admit(state: State, who: Who, *, target: Target, mode: Mode | None = None) -> Limits:
    """The limits of a new session of `who`; 429 when the user has as many as a rule allows."""
    granted = session.admit(state, who, target=target, mode=mode)
    if not granted.sessions or not state.owners.others():
        return granted
    found = await sessionlist.elsewhere(state, who.user)
    return session.admit(state, who, target=target, mode=mode, elsewhere=found)
