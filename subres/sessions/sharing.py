"""Which byte stream a console or display session pumps on the replica that owns it.

A writer dials the machine's console, and its output also goes to the
console's hub (`sessions.hub.Tee`), where observers read it; a kept console's
writer dials nothing and uses the kept connection (`sessions.hub.KeptPort`).
An observer dials nothing: it reads the hub (`sessions.hub.Feed`), and what it
types is dropped. A display's viewer dials the display through the viewer
guard (`sessions.viewer`).

Every observer, of a console or a display, first takes a place among the
observers this replica serves (`watching`), before anything is attached or
dialed: 429 when its console or display already has
`session.maxObserversPerConsole` of them or the replica `session.maxObservers`.
The place goes back when its backend is closed, which ends every session and
every upgrade that failed. A moderator takes an observer's place too.

A writer or a display's interactive viewer that a moderation policy selects
is wrapped in `moderation.Moderated` (`moderated`); a moderator's share, a
console's observer or a display's view-only viewer, in
`moderation.Moderating` (`moderate`), once the policies say it may.
"""

from __future__ import annotations

from subres.engine.stream import ByteStream
from subres.kube.status import StatusError
from subres.policies import Moderation
from subres.sessions import recorded
from subres.sessions.hub import Feed, Hub, KeptPort, Tee
from subres.sessions.moderation import Gate, Moderated, Moderating
from subres.sessions.modes import Mode
from subres.sessions.observers import Slot, TooManyObservers
from subres.sessions.runtime import Runtime, Who
from subres.sessions.target import Target, endpoint_url, key
from subres.sessions.viewer import GuardedDisplay

__all__ = [
    "RETRY_AFTER",
    "console",
    "display",
    "gate",
    "hub",
    "keeps_scrollback",
    "may_moderate",
    "moderate",
    "moderated",
    "moderators",
    "observe",
    "watching",
    "write",
]

RETRY_AFTER = 5
"""Seconds an observer refused for want of a place is told to wait."""


async def console(
    state: Runtime, target: Target, who: Who, *, mode: Mode, tail: int | None
) -> ByteStream:
    """The backend of a console session of `mode` on the console's owner."""
    if mode == Mode.MODERATOR:
        may_moderate(state, target, who)
        return moderate(state, target, observe(state, target, tail=tail), who)
    if mode == Mode.OBSERVER:
        return observe(state, target, tail=tail)
    backend = await write(state, target, endpoint_url(target), tail=tail)
    return moderated(state, target, backend, who)


async def display(state: Runtime, target: Target, who: Who, *, mode: Mode) -> ByteStream:
    """The backend of a display session of `mode` on the display's owner: a connection of
    its own, guarded (view-only but for the interactive viewer, which alone takes no
    observer's place)."""
    if mode == Mode.MODERATOR:
        may_moderate(state, target, who)
    recorded.check(state, target)  # a recording that cannot be kept: 503, before anything
    view_only = mode != Mode.VIEWER
    place = watching(state, target) if view_only else None
    try:
        connection = await state.backends.connect(target, endpoint_url(target))
    except BaseException:
        if place is not None:
            place.release()
        raise
    guarded = GuardedDisplay(connection, view_only=view_only, place=place)
    if mode == Mode.MODERATOR:
        return moderate(state, target, guarded, who)
    return moderated(state, target, guarded, who) if mode == Mode.VIEWER else guarded


async def write(state: Runtime, target: Target, url: str, *, tail: int | None) -> ByteStream:
    """The writer's backend: the kept connection, or one dialed (before any upgrade)."""
    recorded.check(state, target)  # a recording that cannot be kept: 503, before anything
    kept = state.sessions.hubs.get(key(target))
    if kept is not None and kept.keeper is not None:
        if kept.keeper.backend is None:
            raise StatusError(
                503, f"{target.describe()}: the kept console is not connected: {kept.keeper.status}"
            )
        return KeptPort(kept, kept.keeper, tail=tail)
    backend = await state.backends.connect(target, url)
    return Tee(backend, hub(state, target))


def observe(state: Runtime, target: Target, *, tail: int | None) -> Feed:
    """An observer's share of the console, its place taken (429 when there is none)."""
    recorded.check(state, target)
    place = watching(state, target)
    feed = hub(state, target).attach(tail=tail)
    feed.closed_by(place.release)
    return feed


def watching(state: Runtime, target: Target) -> Slot:
    """An observer's place among `target`'s (before anything is dialed or attached)."""
    try:
        return state.observers.take(
            key(target), what=f"the {target.spec.name} of {target.describe()}"
        )
    except TooManyObservers as exc:
        raise StatusError(
            429,
            f"{exc}; try again later",
            details={"retryAfterSeconds": RETRY_AFTER},
            headers=[("Retry-After", str(RETRY_AFTER))],
        ) from None


def keeps_scrollback(state: Runtime, target: Target) -> bool:
    """Whether `target`'s console is kept here, with output to replay (`?tail=`)."""
    kept = state.sessions.hubs.get(key(target))
    return kept is not None and kept.scrollback is not None


def hub(state: Runtime, target: Target) -> Hub:
    """`target`'s console hub."""
    return state.sessions.hub(key(target), feed_limit=state.config.session.observer_backlog)


def moderated(state: Runtime, target: Target, backend: ByteStream, who: Who) -> ByteStream:
    """A writer's or viewer's backend, wrapped when a moderation policy selects the session."""
    policy = Moderation.of(
        state.config.moderation,
        target.obj,
        kind=target.parent.kind,
        subresource=target.spec.name,
        groups=who.groups,
    )
    if policy is None:
        return backend
    console = target.spec.name == "console"
    return Moderated(
        backend, gate=gate(state, target), policy=policy, user=who.user, console=console
    )


def may_moderate(state: Runtime, target: Target, who: Who) -> None:
    """403 unless a moderation policy of this console or display lets `who` moderate it."""
    if not any(p.may_moderate(who.groups) for p in moderators(state, target)):
        raise StatusError(403, _not_a_moderator(state, target, who))


def moderate(state: Runtime, target: Target, share: ByteStream, who: Who) -> ByteStream:
    """A moderator's share (an observer's, a view-only viewer's), counted while it watches
    (`may_moderate` said yes first)."""
    return Moderating(share, gate=gate(state, target), user=who.user, groups=who.groups)


def moderators(state: Runtime, target: Target) -> list[Moderation]:
    """The policies that may select sessions of `target`, whoever opens them."""
    kind, sub = target.parent.kind, target.spec.name
    return [p for p in state.config.moderation if p.covers(target.obj, kind=kind, subresource=sub)]


def _not_a_moderator(state: Runtime, target: Target, who: Who) -> str:
    what = f"the {target.spec.name} of {target.describe()}"
    policies = moderators(state, target)
    if not policies:
        return f"no moderation policy covers {what}: there is nothing to moderate"
    groups = sorted({g for p in policies for g in p.moderators})
    return f"{who.user} may not moderate {what}: its moderators are members of {', '.join(groups)}"


def gate(state: Runtime, target: Target) -> Gate:
    """`target`'s moderation gate; its notes go into the unit's recording."""
    unit = key(target)
    return state.sessions.gate(unit, note=lambda text: state.recordings.note(unit, text))
