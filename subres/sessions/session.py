"""The one lifecycle of every streaming session, whatever its subresource and dialect.

Every handler runs its live part inside `live(...)`, after the upgrade; a
console or vnc session first enters `hold(...)`, before the upgrade:

    async with session.hold(runtime, user, target=..., exclusive=True, mode=...) as held:
        ...upgrade...
        async with session.live(runtime, who, target=..., dialect=..., client=...,
                                held=held) as s:
            await s.run(pump(client, backend, s.record.traffic))

Holding takes an exclusive slot over from its predecessor, which is closed
with 4001 naming the new user, and joins the console's or display's
recording when it is recorded (starting it for the first session). Slots and
recordings are held by the replica that owns the unit (`sessions.members`);
a session fronted by another replica holds them there, through a peer
session (`sessions.peer`, which holds with `owner=False` here). It comes
before the upgrade because both can fail (409 for `preserveSession`, 503
when a required recording cannot start), and the client must get that as a
`Status`; leaving it gives both up. Entering
`live` registers the session and counts it; `run` awaits the work and keeps
its outcome, or that the client's connection was lost (aiohttp then cancels
the handler, and the work stops both directions as it unwinds); leaving
forgets the session, records how and why it ended (`Record`), updates the
metrics and logs one line. Entering also tells a backend that wants to know
(an observer's feed, which may have to cut its client off) how to close the
session. This is the place that audit and observers hook into. Both are
plain objects rather than generator-based context managers: an idle session
should cost no frame.

Every session has a mode (`sessions.modes.Mode`): a console's `writer` (one
at a time) or `observer` (any number, read-only), a display's interactive
`viewer` (one at a time) or view-only `observer`, a moderator of either, a
port-forward's `forwarder`, a USB slot's `redirector` (one at a time).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from subres.engine.pump import Ending, Outcome, Traffic
from subres.kube.status import StatusError
from subres.policies import Limits
from subres.sessions import events, limits, recorded, recordings
from subres.sessions.display import DisplayRecorder, DisplayUnavailable
from subres.sessions.limits import Watch, rbac_name
from subres.sessions.modes import DEFAULT_MODES, Mode
from subres.sessions.recorder import Recorder
from subres.sessions.recordings import Quota, Recording, RecordingUnavailable, Seat
from subres.sessions.registry import Busy, Claim, Closable
from subres.sessions.runtime import Runtime, Who
from subres.sessions.target import Target, endpoint_url, key

__all__ = [
    "Hold",
    "Live",
    "Record",
    "admit",
    "busy",
    "hold",
    "live",
    "record",
]

log = logging.getLogger(__name__)

LOST = Outcome(Ending.CLIENT, "the client connection was lost")


@dataclass
class Record:
    """What is known of one session: who, what, how much, and how it ended."""

    subresource: str
    mode: Mode
    dialect: str
    """The negotiated subprotocol or stream protocol; "raw" for none."""
    kind: str
    namespace: str
    name: str
    user: str
    groups: tuple[str, ...]
    client: str
    """The client's address as this server sees it (kube-apiserver's, behind it)."""
    request_id: str
    unit: str = ""
    """Which of the machine's consoles or USB slots; "" where it has one of the kind."""
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    """This session's own name, unique and safe to show (request ids come from clients)."""
    recorded: bool = False
    """The console session is being recorded."""
    moderators: list[str] = field(default_factory=list)
    """Who moderated the session (a moderation policy selected it), in the order they came."""
    backend: str = ""
    """What opening the backend did that an audit should know (an IPMI console that
    deactivated SOL held by another BMC session)."""
    started: float = field(default_factory=time.time)
    traffic: Traffic = field(default_factory=Traffic)
    outcome: Outcome | None = None
    code: int | None = None
    """The close code sent to the client, when the dialect has one."""
    reason: str = ""
    """Why the session ended, in words."""
    ended: float | None = None

    @property
    def machine(self) -> str:
        """`Machine default/vm1`."""
        return f"{self.kind} {self.namespace}/{self.name}"

    def fields(self) -> dict[str, Any]:
        """The record as flat key/values, for structured logs and audit lines."""
        outcome = self.outcome
        return {
            "subresource": self.subresource,
            "unit": self.unit,
            "mode": self.mode,
            "dialect": self.dialect,
            "kind": self.kind,
            "namespace": self.namespace,
            "name": self.name,
            "user": self.user,
            "groups": list(self.groups),
            "client": self.client,
            "requestID": self.request_id,
            "session": self.id,
            "start": self.started,
            "end": self.ended,
            "bytesUp": self.traffic.up,
            "bytesDown": self.traffic.down,
            "endedBy": outcome.ending.value if outcome else None,
            "code": self.code,
            "reason": self.reason,
            **({"moderatedBy": list(self.moderators)} if self.moderators else {}),
            **({"backend": self.backend} if self.backend else {}),
        }


class Live:
    """A session while it lives: what the registry closes, with its `Record`.

    Enter it (`async with`) once the client is upgraded; `live()` builds it.
    """

    def __init__(
        self,
        state: Runtime,
        record: Record,
        client: Closable,
        *,
        held: Hold | None,
        transport: asyncio.Transport | None,
        target: Target,
        backend: object = None,
        limits: Limits | None = None,
    ) -> None:
        self.state = state
        self.record = record
        self.client = client
        self.claim = held.claim if held is not None else None
        self.seat = held.seat if held is not None else None
        self.transport = transport
        self.target = target
        """The parent as it was when the session started (Events name it)."""
        self.backend = backend
        self.limits = limits
        self._watch: Watch | None = None

    @property
    def user(self) -> str:
        """Whose session (what `maxSessionsPerUser` counts)."""
        return self.record.user

    @property
    def rbac(self) -> str:
        """Its subresource as RBAC names it (`console-observe`)."""
        return rbac_name(self.record.subresource, self.record.mode)

    @property
    def parent(self) -> Mapping[str, Any]:
        """The parent object."""
        return self.target.obj

    async def __aenter__(self) -> Live:
        self.state.sessions.start(self.claim, self)
        self.state.metrics.session_started(self.record.subresource)
        attached = getattr(self.backend, "attached", None)
        if callable(attached):
            attached(self._close_later)
        if self.seat is not None:
            self._recorded(self.seat)
        if self.limits is not None:
            self._watch = Watch(self.limits, close=self._close_later, last_input=self._input())
        if getattr(self.backend, "recorded", False) is True:
            self.record.recorded = True  # by the replica that owns the console
        notice = getattr(self.backend, "notice", "")
        if isinstance(notice, str):
            self.record.backend = notice
        fields = self.record.fields()
        self.state.audit.started(fields)
        self._event(events.opened(fields))
        return self

    def _input(self) -> Callable[[], float] | None:
        """When the client last gave input, for its idle timeout; None for a session that
        takes none. A backend that tells input from other bytes (a display's viewer, whose
        update requests are not input) says when itself."""
        if self.record.mode not in (Mode.WRITER, Mode.VIEWER, Mode.FORWARDER, Mode.REDIRECTOR):
            return None
        last_input = getattr(self.backend, "last_input", None)
        if callable(last_input):
            return cast("Callable[[], float]", last_input)
        traffic = self.record.traffic
        return lambda: traffic.last_up

    def _recorded(self, seat: Seat) -> None:
        """Tell the client it is recorded; a required recording that fails closes it."""
        self.record.recorded = True
        seat.bind(self._close_later)
        announce = getattr(self.backend, "announce", None)
        if callable(announce):
            announce(recordings.BANNER)

    def _event(self, event: tuple[str, str] | None) -> None:
        if event is not None:
            reason, message = event
            self.state.events.emit(self.parent, reason=reason, message=message)

    def _close_later(self, code: int, reason: str) -> None:
        self.state.sessions.close_later(self, code, reason)

    async def __aexit__(self, *_: object) -> None:
        if self._watch is not None:
            self._watch.stop()
        self.state.sessions.end(self.claim, self)
        moderators = getattr(self.backend, "moderators", None)
        if isinstance(moderators, list):
            self.record.moderators = [str(m) for m in moderators]
        _finish(self.record, self.client)
        _report(self.state, self.record)
        fields = self.record.fields()
        self.state.audit.ended(fields)
        self._event(events.closed(fields))

    async def close(self, code: int = 1000, reason: str = "") -> None:
        """Close the client side (a takeover, a shutdown), remembering the code and reason."""
        if self.record.code is None:
            self.record.code = code
            self.record.reason = reason
        await self.client.close(code, reason)

    def drop(self) -> None:
        """Drop the client's connection at once (a shutdown whose grace ran out)."""
        if self.record.code is None:
            self.record.reason = "dropped: the server's shutdown grace ran out"
        if self.transport is not None:
            self.transport.abort()

    async def run(self, work: Awaitable[Outcome]) -> Outcome:
        """Run the session's work to its end and keep how it ended.

        aiohttp cancels the handler when the client's connection is lost; the
        work's own cleanup (every pump stops its directions in `finally`)
        runs, and the session is recorded as ended by the client.
        """
        try:
            self.record.outcome = await work
        except asyncio.CancelledError:
            self.record.outcome = LOST
            raise
        return self.record.outcome


class Hold:
    """A session's exclusive slot and its place in the recording, from before its
    upgrade to its end; `hold()` builds it.

    Entering claims the slot (`claim`; None for a session without one) and
    joins the recording (`seat`; None when not recorded); leaving gives both up.
    """

    def __init__(
        self,
        state: Runtime,
        user: str,
        target: Target,
        *,
        exclusive: bool,
        preserve: bool,
        mode: Mode | None,
        owner: bool,
        via: str = "",
    ) -> None:
        self.state = state
        self.via = via
        """The front replica a peer session came through (said in the recording)."""
        self.user = user
        self.target = target
        self.exclusive = exclusive
        self.preserve = preserve
        self.mode = mode or DEFAULT_MODES.get(target.spec.name, Mode.WRITER)
        self.owner = owner
        self.claim: Claim | None = None
        self.seat: Seat | None = None

    async def __aenter__(self) -> Hold:
        if self.exclusive:
            try:
                self.claim = await self.state.sessions.claim(
                    key(self.target), user=self.user, preserve=self.preserve
                )
            except Busy:
                raise busy(self.target) from None
        try:
            self.seat = await self._join() if self.owner else None
        except BaseException:
            self._release()
            raise
        return self

    async def _join(self) -> Seat | None:
        """Join the recording when the console or display is recorded (503 if required and
        it cannot start)."""
        target, kept = self.target, self.state.recordings
        if not kept.wanted(target.spec, target.obj):
            return None
        try:
            seat = await kept.join(
                key(target),
                where=recorded.folder(target),
                audit=target.spec.record in ("always", "required"),
                start=self._start,
                who=f"{self.user} ({self.mode}{f', via {self.via}' if self.via else ''})",
                what=recordings.title(target),
                required=target.spec.record == "required",
            )
        except RecordingUnavailable as exc:
            raise StatusError(503, str(exc)) from None
        if seat is not None and self.claim is not None and self.claim.took_over:
            kept.marker(seat, f"{self.user} took over from {self.claim.took_over}")
        return seat

    async def _start(self, path: Path, quota: Quota) -> Recording:
        """The recording of the console or display."""
        if self.target.spec.name == "vnc":
            return await self._start_display(path, quota)
        return self._start_console(path, quota)

    async def _start_display(self, path: Path, quota: Quota) -> Recording:
        """A display's recording: its own view-only connection (`sessions.display`)."""
        target, config = self.target, self.state.config
        recorder = DisplayRecorder(
            path,
            title=recordings.title(target),
            max_file=config.consoles.max_recording_bytes,
            rate=config.consoles.display_rate,
            quota=quota,
        )
        try:
            stream = await self.state.backends.connect(target, endpoint_url(target))
        except StatusError as exc:
            raise RecordingUnavailable(f"cannot reach the display: {exc.message}") from None
        try:
            await recorder.begin(stream, deadline=config.session.connect_timeout)
        except DisplayUnavailable as exc:
            await stream.close()
            raise RecordingUnavailable(str(exc)) from None
        return recorder

    def _start_console(self, path: Path, quota: Quota) -> Recording:
        """A console's recording: a sink of its hub (what a kept console replays first)."""
        target = self.target
        hub = self.state.sessions.hub(
            key(target), feed_limit=self.state.config.session.observer_backlog
        )
        recorder = Recorder(
            path,
            title=recordings.title(target),
            max_file=self.state.config.consoles.max_recording_bytes,
            size=hub.size,
            on_close=hub.remove_sink,
            quota=quota,
        )
        hub.add_sink(recorder)
        if hub.scrollback is not None:
            # What a kept console replays to the first to attach is part of what they saw.
            recorder.output(hub.scrollback.tail())
        for note in hub.notes:
            recorder.marker(note)
        hub.notes.clear()
        return recorder

    async def __aexit__(self, *_: object) -> None:
        self.leave()

    def leave(self) -> None:
        """Give up the place in the recording, then the slot."""
        if self.seat is not None:
            self.seat.leave()
            self.seat = None
        self._release()

    def _release(self) -> None:
        if self.claim is not None:
            self.state.sessions.release(self.claim)
            self.claim = None


def busy(target: Target) -> StatusError:
    """The 409 of a session that asked to preserve the one holding its slot."""
    return StatusError(
        409,
        f"{target.describe()} already has a {target.spec.name} session; "
        "connect without preserveSession=true to take it over",
    )


def hold(
    state: Runtime,
    user: str,
    *,
    target: Target,
    exclusive: bool,
    preserve: bool = False,
    mode: Mode | None = None,
    owner: bool = True,
    via: str = "",
) -> Hold:
    """The session's exclusive slot (when `exclusive`) and its place in the recording, to
    enter before the upgrade (see the module docstring).

    With `preserve`, a slot another session holds is a 409 instead of a takeover.
    `owner` False: another replica owns the unit and records the session;
    `via`: the front replica of a peer session.
    """
    return Hold(
        state,
        user,
        target,
        exclusive=exclusive,
        preserve=preserve,
        mode=mode,
        owner=owner,
        via=via,
    )


def record(target: Target, who: Who, *, dialect: str, mode: Mode | None = None) -> Record:
    """A new session's `Record`; `mode` defaults to the subresource's interactive one."""
    return Record(
        subresource=target.spec.name,
        mode=mode or DEFAULT_MODES.get(target.spec.name, Mode.WRITER),
        dialect=dialect or "raw",
        kind=target.parent.kind,
        namespace=target.namespace,
        name=target.name,
        user=who.user,
        groups=who.groups,
        client=who.client,
        request_id=who.request_id,
        unit=target.spec.unit,
    )


def live(
    state: Runtime,
    who: Who,
    *,
    target: Target,
    dialect: str,
    client: Closable,
    held: Hold | None = None,
    mode: Mode | None = None,
    backend: object = None,
    limits: Limits | None = None,
) -> Live:
    """The session of `client`, to enter once upgraded: registered, counted, finally recorded.

    `mode` defaults to the subresource's interactive one. A `backend` with an
    `attached(closer)` method is given a way to close this session; `limits`
    (from `admit`) end it when it lasts too long or goes idle.
    """
    return Live(
        state,
        record(target, who, dialect=dialect, mode=mode),
        client,
        held=held,
        transport=who.transport,
        target=target,
        backend=backend,
        limits=limits,
    )


def admit(
    state: Runtime,
    who: Who,
    *,
    target: Target,
    mode: Mode | None = None,
    elsewhere: Sequence[tuple[str, str]] = (),
) -> Limits:
    """The limits of a new session of `who`, before its upgrade; 429 when the user already
    has as many sessions as a rule allows, counting those this replica fronts and
    `elsewhere` (the subresources and modes of the user's sessions on other replicas)."""
    mode = mode or DEFAULT_MODES.get(target.spec.name, Mode.WRITER)
    others = [limits.Counted(who.user, rbac_name(sub, how)) for sub, how in elsewhere]
    return limits.admit(
        state.config.limits,
        user=who.user,
        groups=who.groups,
        subresource=rbac_name(target.spec.name, mode),
        live=[*(s for s in state.sessions.live if isinstance(s, Live)), *others],
    )


def _report(state: Runtime, record: Record) -> None:
    ending = record.outcome.ending.value if record.outcome else Ending.ERROR.value
    seconds = (record.ended or record.started) - record.started
    state.metrics.session_ended(
        subresource=record.subresource,
        dialect=record.dialect,
        ending=ending,
        seconds=seconds,
        traffic=record.traffic,
    )
    log.info(
        "%s of %s by %s (%s, %s) ended by %s after %.1fs, %d B up, %d B down: %s",
        record.subresource,
        record.machine,
        record.user,
        record.mode,
        record.dialect,
        ending,
        seconds,
        record.traffic.up,
        record.traffic.down,
        record.reason,
        extra={"fields": record.fields()},
    )


def _finish(record: Record, client: Closable) -> None:
    record.ended = time.time()
    if record.code is None:
        # WebSocket clients know the close code sent or received; SPDY has none.
        code = getattr(client, "close_code", None)
        record.code = code if isinstance(code, int) else None
    if not record.reason and record.outcome is not None:
        record.reason = record.outcome.reason
