"""Moderated sessions: a writer or an interactive viewer that works only while moderators watch.

A `moderation` policy of the configuration (`policies.Moderation`) selects
sessions by the parent's kind and labels, the subresource and the user's
groups. Such a session is upgraded as any other, then waits: its backend is
wrapped in `Moderated`, which passes nothing either way until enough
members of the policy's moderator groups (not the writer) attach through
the `…-moderate` path (`Moderating`, a read-only share RBAC grants on its
own). A console's writer is told so in its own output, in every dialect,
and what it types meanwhile is dropped, while its end of input (v5's close of
stdin, SPDY's FIN) waits for the session to open; a display's viewer waits
for the display to speak. When moderators leave, `onLeave: pause` stops both ways
again (and says so) until enough are back, `onLeave: terminate` ends the
session (4007). A moderator ends it at will (`Gate.end`, 4006).

Everything here lives with the unit's owner (`sessions.members`), beside
its hub: writers and moderators reach it through peer sessions from any
replica. The recording notes who moderated, when it paused and who ended
it; the session's audit line and Event name its moderators.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Sequence
from typing import Any

from subres.engine.stream import ByteStream
from subres.engine.websocket import CloseCode
from subres.policies import Moderation
from subres.sessions.hub import Closer

__all__ = ["Gate", "Moderated", "Moderating"]

log = logging.getLogger(__name__)

_tokens = itertools.count()


class Gate:
    """One unit's moderators, and the moderated sessions that wait on them.

    `on_idle` is told when it has neither (its registry forgets it);
    `note` writes a line into the unit's recording.
    """

    def __init__(self, *, on_idle: Callable[[Gate], None], note: Callable[[str], None]) -> None:
        self.moderators: dict[int, tuple[str, tuple[str, ...]]] = {}
        """Each attached moderator session's user and groups."""
        self.sessions: set[Moderated] = set()
        self._on_idle = on_idle
        self._note = note

    def watching(self, policy: Moderation, *, writer: str) -> list[str]:
        """The moderators who count for `writer`'s session under `policy`, each once."""
        users = {u for u, groups in self.moderators.values() if policy.may_moderate(groups)}
        users.discard(writer)
        return sorted(users)

    def join(self, user: str, groups: Sequence[str]) -> int:
        """A moderator attached; the token to `leave` with."""
        token = next(_tokens)
        self.moderators[token] = (user, tuple(groups))
        self._note(f"{user} started moderating")
        self._changed()
        return token

    def leave(self, token: int) -> None:
        """A moderator left."""
        user, _ = self.moderators.pop(token, ("", ()))
        if user:
            self._note(f"{user} stopped moderating")
        self._changed()

    def end(self, by: str) -> int:
        """A moderator ends the moderated sessions; how many there were."""
        ended = list(self.sessions)
        for session in ended:
            session.end(f"ended by the moderator {by}")
        if ended:
            self._note(f"{by} ended the session")
        return len(ended)

    def add(self, session: Moderated) -> None:
        """A moderated session waits on this gate."""
        self.sessions.add(session)
        session.changed()

    def remove(self, session: Moderated) -> None:
        """A moderated session ended."""
        self.sessions.discard(session)
        self._check_idle()

    def _changed(self) -> None:
        for session in list(self.sessions):
            session.changed()
        self._check_idle()

    def _check_idle(self) -> None:
        if not self.sessions and not self.moderators:
            self._on_idle(self)


class Moderated:
    """A moderated session's backend: nothing passes until its moderators watch.

    `console`: the client reads what is said (waiting, paused, resumed) in
    its output and what it types meanwhile is dropped; a display's viewer
    just waits, its input held until the session goes on.
    """

    def __init__(
        self,
        backend: ByteStream,
        *,
        gate: Gate,
        policy: Moderation,
        user: str,
        console: bool,
    ) -> None:
        self._backend = backend
        self._gate = gate
        self._policy = policy
        self._user = user
        self._console = console
        self._open = False
        self._ended = False
        self._started = False
        self._said: list[bytes] = []
        self._held: bytes | None = None
        self.holding_eof = False
        """The client ended its input while the session was not open: the backend hears it
        once the session opens (ending input is input, and a shell ends on it)."""
        self._reading: asyncio.Future[bytes] | None = None
        self._wake = asyncio.Event()
        self._closer: Closer | None = None
        self.moderators: list[str] = []
        """Everyone who moderated this session, in the order they came."""
        if console:
            self._say(f"waiting for {self._wanted()} to watch, as policy {policy.name} requires; "
                      "what you type is dropped until then")  # fmt: skip
        gate.add(self)

    def __getattr__(self, name: str) -> Any:
        # announce, resize, exit_code, recorded: the wrapped backend's.
        return getattr(self._backend, name)

    def _wanted(self) -> str:
        count = self._policy.count
        groups = " or ".join(self._policy.moderators)
        return f"{count} moderator{'s' if count > 1 else ''} (a member of {groups})"

    def _say(self, text: str) -> None:
        if self._console:  # a display's viewer has no text to read
            self._said.append(f"\r\n[subres: {text}]\r\n".encode())
        self._wake.set()

    def attached(self, closer: Closer) -> None:
        """The session is live: `closer` ends it (the wrapped backend gets it once open)."""
        self._closer = closer
        if self._ended:
            self._close(CloseCode.MODERATOR_LEFT, "the session's moderators left")

    def changed(self) -> None:
        """The moderators changed: open, pause, resume or end."""
        watching = self._gate.watching(self._policy, writer=self._user)
        self.moderators += [m for m in watching if m not in self.moderators]
        enough = len(watching) >= self._policy.count
        if enough and not self._open and not self._ended:
            self._open = True
            self._say(f"{', '.join(watching)} moderating; the session "
                      f"{'goes on' if self._started else 'starts'}")  # fmt: skip
            self._started = True
            if self._closer is not None:
                inner = getattr(self._backend, "attached", None)
                if callable(inner):
                    inner(self._closer)
        elif not enough and self._open:
            self._open = False
            if self._policy.on_leave == "terminate":
                self.end(f"the moderators left; policy {self._policy.name} ends the session",
                         code=CloseCode.MODERATOR_LEFT)  # fmt: skip
            else:
                self._say(f"paused: waiting for {self._wanted()} to watch again")
        self._wake.set()

    def end(self, reason: str, *, code: int = CloseCode.MODERATOR_ENDED) -> None:
        """End the session, saying why."""
        self._ended = True
        self._open = False
        self._wake.set()
        self._close(code, reason)

    def _close(self, code: int, reason: str) -> None:
        if self._closer is not None:
            self._closer(code, reason)

    async def read(self) -> bytes:
        """What is said, then (while open) the backend's output.

        The backend is read in a task of its own, so that a pause is said at
        once; what it gives meanwhile is held until the session goes on.
        """
        while True:
            if self._said and self._console:
                said, self._said = b"".join(self._said), []
                return said
            if self._open and self._held is not None:
                held, self._held = self._held, None
                return held
            if self._open and self.holding_eof:
                self.holding_eof = False
                await self._backend.write_eof()
            if self._open and self._reading is None:
                self._reading = asyncio.ensure_future(self._backend.read())
            data = await self._next()
            if data is not None:
                if self._open or not data:
                    return data
                self._held = data

    async def _next(self) -> bytes | None:
        """The backend's next chunk, or None when something changed first."""
        self._wake.clear()
        changed = asyncio.ensure_future(self._wake.wait())
        try:
            waits: set[asyncio.Future[Any]] = {changed}
            if self._reading is not None:
                waits.add(self._reading)
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            changed.cancel()
        reading = self._reading
        if reading is None or not reading.done():
            return None
        self._reading = None
        return reading.result()

    async def write(self, data: bytes) -> None:
        """To the backend once open; a console's input is dropped before, a viewer's waits."""
        while not self._open and not self._console and not self._ended:
            self._wake.clear()
            await self._wake.wait()
        if self._open:
            await self._backend.write(data)

    async def write_eof(self) -> None:
        """The client is done sending: the backend hears it now if the session is open, else
        when it opens (`read` passes it on then, as it would the backend's output)."""
        if self._open:
            await self._backend.write_eof()
        elif not self._ended:
            self.holding_eof = True

    async def close(self) -> None:
        """Leave the gate, then close the backend."""
        self._gate.remove(self)
        reading = self._reading
        if reading is not None:
            reading.cancel()
            await asyncio.wait([reading])
            if not reading.cancelled():
                reading.exception()  # seen: the session is over anyway
        await self._backend.close()


class Moderating:
    """A moderator's share of the console or display: it watches, and counts while it does."""

    def __init__(self, backend: ByteStream, *, gate: Gate, user: str, groups: Sequence[str]):
        self._backend = backend
        self._gate = gate
        self._token = gate.join(user, groups)

    def __getattr__(self, name: str) -> Any:
        # attached, announce: the wrapped share's.
        return getattr(self._backend, name)

    async def read(self) -> bytes:
        """What the writer sees."""
        return await self._backend.read()

    async def write(self, data: bytes) -> None:
        """A moderator's input: to the share, which drops it."""
        await self._backend.write(data)

    async def write_eof(self) -> None:
        """Nothing to tell."""
        await self._backend.write_eof()

    async def close(self) -> None:
        """Stop counting, then detach."""
        self._gate.leave(self._token)
        await self._backend.close()
