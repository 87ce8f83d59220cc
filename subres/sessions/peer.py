"""Peer sessions: a session fronted by one replica and served by the owner of its unit.

The front (the replica kube-apiserver chose) has authenticated and
authorized the client, found and checked the parent and negotiated the
dialect. When another replica owns the unit (`sessions.members`), the front
asks it for a peer session (`front`); the owner checks that it owns the
unit, finds the parent in its own cache, claims the slot (takeover, 409) and
dials or attaches as a session of its own would (`prepare`), answers 101
and relays (`serve`). The request carries, as headers:

    Subres-Unit: machines/console/default/vm1[/console name]
    Subres-Mode: writer | observer | viewer | moderator | redirector (`sessions.modes`)
    Subres-User: the user, whole (`auth.user.encode`: name, uid, groups, extra)
    Subres-Client, Subres-Request-Id
    Subres-Front: the front replica's name
    Subres-Preserve: true     (preserveSession)
    Subres-Tail: N            (?tail=N)

A refusal is the owner's `Status`, which the front answers its client before
its own upgrade; 421 means "not the owner" (the views of the members
differ for a moment), on which the front looks again and retries once. A
dial is abandoned the moment its owner leaves the members (a frozen owner
accepts connections and answers nothing: waiting out the connect timeout
would delay the takeover past it), and the front asks the new owner. After
101 the owner relays frames (`protocol.relay`, CLOSE when it ends the session:
a takeover is 4001 with its reason; EXIT before its EOF when its backend ran a
command whose exit status it knows). The front writes the audit lines,
metrics and Events; the owner holds the slot and writes the recording (its
101 says `Subres-Recorded: true`). For USB redirection the owner of the
machine's slots chooses one and says which in its 101 (`Subres-Unit: 0`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from subres.auth import user
from subres.auth.user import UserInfo
from subres.backends.peer import PeerRefused, PeerStream
from subres.engine.pump import Traffic, pump
from subres.engine.stream import ByteStream, Terminal
from subres.kube.status import StatusError
from subres.protocol import digits, relay
from subres.protocol.channels import TerminalSize
from subres.sessions import recordings, sharing, usbslots
from subres.sessions.modes import Mode
from subres.sessions.registry import SessionKey
from subres.sessions.runtime import Runtime, Who
from subres.sessions.session import Hold, busy, hold
from subres.sessions.target import Target, key

__all__ = [
    "NOT_OWNER",
    "Ask",
    "Carrier",
    "FrameClient",
    "Prepared",
    "front",
    "headers",
    "identity",
    "parse",
    "prepare",
    "release",
    "serve",
]

log = logging.getLogger(__name__)

NOT_OWNER = 421
"""The owner's answer when it does not think it owns the unit."""
MAX_TAIL = (1 << 31) - 1
"""The most lines a peer session may replay (what a front lets a client ask)."""
MODES = {
    "console": (Mode.WRITER, Mode.OBSERVER, Mode.MODERATOR),
    "vnc": (Mode.VIEWER, Mode.OBSERVER, Mode.MODERATOR),
    "usbredir": (Mode.REDIRECTOR,),
}
"""The subresources served by their unit's owner, and their modes."""


class Carrier(Protocol):
    """The upgraded connection from the front (`engine.upgrade.UpgradedSocket`)."""

    async def read(self) -> bytes:
        """What arrived; b"" once the front hung up."""
        ...

    async def write(self, data: bytes) -> None:
        """Send, waiting while the front is slow."""
        ...

    async def close(self) -> None:
        """Hang up."""
        ...


@dataclass(frozen=True)
class Ask:
    """What a front asks of an owner."""

    unit: SessionKey
    mode: Mode
    who: Who
    front: str
    preserve: bool = False
    tail: int | None = None


def headers(ask: Ask) -> list[tuple[str, str]]:
    """The peer request's headers for `ask`."""
    unit = ask.unit
    parts = [unit.resource, unit.subresource, unit.namespace, unit.name]
    if unit.unit:
        parts.append(unit.unit)
    out = [
        ("Subres-Unit", "/".join(parts)),
        ("Subres-Mode", ask.mode.value),
        ("Subres-User", user.encode(ask.who.identity)),
        ("Subres-Client", ask.who.client),
        ("Subres-Request-Id", ask.who.request_id),
        ("Subres-Front", ask.front),
    ]
    if ask.preserve:
        out.append(("Subres-Preserve", "true"))
    if ask.tail is not None:
        out.append(("Subres-Tail", str(ask.tail)))
    return out


def parse(one: Mapping[str, str]) -> Ask:
    """The `Ask` of a peer request's headers (`one`: each header's value; 400 otherwise)."""
    parts = one.get("Subres-Unit", "").split("/")
    if len(parts) not in (4, 5) or not all(parts[:4]):
        raise StatusError(400, "the peer request names no unit")
    unit = SessionKey(*parts)
    text = one.get("Subres-Mode", "")
    mode = next((m for m in MODES.get(unit.subresource, ()) if m == text), None)
    if mode is None:
        raise StatusError(400, f"no {unit.subresource} session has the mode {text[:64]!r}")
    tail = one.get("Subres-Tail")
    lines = digits.value(tail, cap=MAX_TAIL) if tail is not None and digits.plain(tail) else -1
    if tail is not None and not 0 <= lines <= MAX_TAIL:
        raise StatusError(400, f"Subres-Tail must be a number of lines, not {tail[:64]!r}")
    who = Who(
        identity=identity(one.get("Subres-User", "")),
        client=one.get("Subres-Client", ""),
        request_id=one.get("Subres-Request-Id", ""),
    )
    return Ask(
        unit,
        mode,
        who,
        front=one.get("Subres-Front", ""),
        preserve=one.get("Subres-Preserve") == "true",
        tail=lines if tail is not None else None,
    )


def identity(value: str) -> UserInfo:
    """The user a peer request carries (400 when it carries none, or not whole)."""
    try:
        return user.decode(value)
    except ValueError as exc:
        raise StatusError(400, f"the peer request names no user: {exc}") from None


# --- the front -----------------------------------------------------------------------------


async def front(
    state: Runtime, target: Target, who: Who, *, mode: Mode, preserve: bool, tail: int | None
) -> PeerStream | None:
    """A peer session on the owner of `target`'s unit; None when this replica owns it.

    Every refusal is a `StatusError` with the owner's code (503 when it
    cannot be reached), before the client's upgrade.
    """
    unit = key(target)
    ask = Ask(unit, mode, who, front=state.replica, preserve=preserve, tail=tail)
    for _ in range(2):  # once more after a 421: the views of the members may differ a moment
        owner = state.owners.owner(unit)
        if owner is None:
            raise StatusError(503, f"no replica serves the {unit} yet; try again shortly")
        if owner == state.replica:
            return None
        address = state.owners.addresses.get(owner)
        if address is None:
            raise StatusError(503, f"the replica {owner} owning the {unit} has no address")
        try:
            stream = await _dial(state, owner, address, ask)
        except PeerRefused as exc:
            if exc.code != NOT_OWNER:
                raise StatusError(exc.code, str(exc)) from None
        else:
            if stream is not None:
                return stream
            log.info(
                "the replica %s left while dialed for the %s: asking its successor", owner, unit
            )
        await asyncio.sleep(0)  # let the watch catch up
    raise StatusError(503, f"the replicas do not agree yet on who serves the {unit}; try again")


async def _dial(
    state: Runtime, owner: str, address: tuple[str, int], ask: Ask
) -> PeerStream | None:
    """The peer session `owner` answers; None when `owner` left the members while it was
    dialed: a frozen or lost owner's dial is abandoned then, not at the connect timeout."""
    dialing = asyncio.ensure_future(state.peers.open(owner, address, headers(ask)))
    with state.owners.leaving(owner, dialing.cancel):
        try:
            return await dialing
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # the front's own request is cancelled (its client left)
            return None


# --- the owner -----------------------------------------------------------------------------


@dataclass
class Prepared:
    """An owner's side of a peer session before its upgrade: its backend, slot and recording."""

    ask: Ask
    target: Target
    backend: ByteStream
    held: Hold


async def prepare(state: Runtime, ask: Ask) -> Prepared:
    """Check ownership and the parent, dial or attach, claim the slot and join the recording:
    everything that can still be a Status."""
    if not state.owners.mine(ask.unit):
        raise StatusError(NOT_OWNER, f"the replica {state.replica} does not own the {ask.unit}")
    parent = state.config.parent(ask.unit.resource)
    spec = None
    if parent is not None:
        spec = parent.subresources.get(ask.unit.subresource)
        if ask.unit.subresource == "console":
            spec = parent.console(ask.unit.unit)
    if parent is None or spec is None:
        raise StatusError(404, f"no {ask.unit} of {ask.unit.resource} here")
    target = state.backends.checked(parent, spec, ask.unit.namespace, ask.unit.name)
    if ask.preserve and state.sessions.active(ask.unit):
        raise busy(target)  # without dialing
    if spec.name == "usbredir":
        target, url = usbslots.choose(
            state.sessions, target, usbslots.slots(target), preserve=ask.preserve
        )
        backend: ByteStream = await state.backends.connect(target, url)
    else:
        backend = await _backend(state, target, ask)
    held = hold(
        state,
        ask.who.user,
        target=target,
        exclusive=ask.mode in (Mode.WRITER, Mode.VIEWER, Mode.REDIRECTOR),
        preserve=ask.preserve,
        mode=ask.mode,
        via=ask.front,
    )
    try:
        await held.__aenter__()
    except BaseException:
        await backend.close()
        raise
    return Prepared(ask, target, backend, held)


async def _backend(state: Runtime, target: Target, ask: Ask) -> ByteStream:
    if target.spec.name == "console":
        return await sharing.console(state, target, ask.who, mode=ask.mode, tail=ask.tail)
    return await sharing.display(state, target, ask.who, mode=ask.mode)


def release(state: Runtime, prepared: Prepared) -> None:
    """Give up what `prepare` took, when the upgrade failed."""
    prepared.held.leave()


async def serve(state: Runtime, prepared: Prepared, carrier: Carrier) -> None:
    """Relay between the front (frames over `carrier`, upgraded) and the backend, to the end."""
    claim = prepared.held.claim
    client = FrameClient(carrier, prepared.backend)
    session = _PeerSession(client)
    state.sessions.start(claim, session)

    def close(code: int, reason: str) -> None:
        state.sessions.close_later(session, code, reason)

    attached = getattr(prepared.backend, "attached", None)
    if callable(attached):
        attached(close)
    try:
        if prepared.held.seat is not None:
            prepared.held.seat.bind(close)
            announce = getattr(prepared.backend, "announce", None)
            if callable(announce):
                announce(recordings.BANNER)
        await pump(client, prepared.backend, client.traffic)
    finally:
        state.sessions.end(claim, session)
        prepared.held.leave()
        await prepared.backend.close()
        await client.close()


class _PeerSession:
    """What the owner's registry closes: a takeover or a move ends the front's session."""

    def __init__(self, client: FrameClient) -> None:
        self.client = client

    async def close(self, code: int = 1000, reason: str = "") -> None:
        """Tell the front how its client's session ends, then hang up."""
        await self.client.end(code, reason)

    def drop(self) -> None:
        """Nothing to do at once: the server's cleanup closes the connection."""


class FrameClient:
    """The front, as the owner's pump sees it: a `ClientStream` over relay frames."""

    def __init__(self, carrier: Carrier, backend: ByteStream) -> None:
        self._carrier = carrier
        self._backend = backend
        self._decoder = relay.FrameDecoder(partial=True, peer=True)
        self._gone = False
        self._eof = False
        """The front's EOF frame arrived (its client half-closed)."""
        self._eof_due = False
        """...and `read` has yet to report it."""
        self.traffic = Traffic()

    @property
    def gone(self) -> bool:
        """The front hung up."""
        return self._gone

    async def read(self) -> bytes:
        """The front's next bytes; b"" at its EOF frame (once), and when it hung up.

        After the EOF frame, reading goes on (resizes, a CLOSE) until the
        front hangs up, as the pump expects of a half-closed client.
        """
        while not self._gone:
            if self._eof_due:
                self._eof_due = False
                return b""
            try:
                chunk = await self._carrier.read()
            except (OSError, RuntimeError):
                chunk = b""
            if not chunk:
                self._gone = True
                break
            try:
                data = self._handle(self._decoder.feed(chunk))
            except relay.FrameError as exc:
                log.warning("a front broke the peer protocol: %s", exc)
                self._gone = True
                break
            if data:
                return data
        return b""

    def _handle(self, events: list[relay.Event]) -> bytes:
        data = bytearray()
        for event in events:
            if isinstance(event, relay.DataReceived):
                if not self._eof:
                    data += event.data
            elif isinstance(event, relay.ResizeReceived):
                resize = getattr(self._backend, "resize", None)
                if callable(resize):
                    resize(TerminalSize(event.width, event.height))
            elif isinstance(event, relay.EofReceived):
                self._eof_due = not self._eof
                self._eof = True
            elif isinstance(event, relay.ErrorReceived | relay.CloseReceived):
                self._gone = True  # the front's client is gone
            # An EXIT means nothing here: only the owner's backend runs a command.
        return bytes(data)

    async def write(self, data: bytes) -> None:
        """Bytes for the front's client."""
        await self._carrier.write(relay.data(data))

    async def write_eof(self) -> None:
        """The backend ended: the front's client sees the end, after the command's exit status
        when the backend ran one (its client reports it as a local session would)."""
        code = Terminal(self._backend).exit_code()
        frames = relay.eof() if code is None else relay.exit_status(code) + relay.eof()
        with contextlib.suppress(OSError, RuntimeError):
            await self._carrier.write(frames)

    async def abort(self, reason: str) -> None:
        """The backend failed: say why, and end."""
        with contextlib.suppress(OSError, RuntimeError):
            await self._carrier.write(relay.error(reason))

    async def end(self, code: int, reason: str) -> None:
        """The session ends with `code` for the front's client (4001 taken over, 1001 moved).

        The front closes its client and hangs up, which ends this side's pump.
        """
        with contextlib.suppress(OSError, RuntimeError):
            await self._carrier.write(relay.close(code, reason))

    async def close(self) -> None:
        """Hang up."""
        self._gone = True
        with contextlib.suppress(OSError, RuntimeError):
            await self._carrier.close()
