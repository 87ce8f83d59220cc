"""The pump: joins a client stream and a backend stream until one side ends.

Backpressure comes from awaiting each write before the next read. The
backend's EOF ends the session (the client is told with `write_eof`); the
client going away ends it too; a client half-close reaches the backend as EOF
while replies keep flowing back. A backend that fails (a reset, a write that
makes no progress) ends the session with the client told why (`abort`).
Whichever side ends first, the other direction is stopped however blocked it
is: a client that vanished never leaves a session waiting on its backend.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from subres.engine.stream import ByteStream, Chunk

__all__ = [
    "END_GRACE",
    "ClientStream",
    "Ending",
    "Gathering",
    "Outcome",
    "Traffic",
    "WritesLines",
    "pump",
]

log = logging.getLogger(__name__)

END_GRACE = 10.0
"""After the backend ended, seconds the client may take to see it before its side is cut."""


class ClientStream(ByteStream, Protocol):
    """The client side of a session.

    `read` returns b"" when the client has no more input. If `gone` is False
    then, it was a half-close: a further `read` waits until the client is gone.
    """

    @property
    def gone(self) -> bool:
        """True once the client closed or vanished: nothing flows either way."""
        ...

    async def abort(self, reason: str) -> None:
        """End the session from our side because something failed."""
        ...


class Gathering(Protocol):
    """A client stream that can hand over everything received so far, as it came."""

    async def read_gathered(self) -> list[Chunk]:
        """What `read` would return, as the chunks it arrived in (views, not copies);
        [] where `read` returns b""."""
        ...


class WritesLines(Protocol):
    """A backend that writes several chunks in one system call."""

    async def writelines(self, chunks: list[Chunk]) -> None:
        """Write `chunks` in order, waiting while the peer is slow."""
        ...


class Ending(enum.Enum):
    """Who ended a session."""

    BACKEND = "backend"
    CLIENT = "client"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a session ended, and why in words."""

    ending: Ending
    reason: str


@dataclass(slots=True)
class Traffic:
    """Bytes relayed so far; several pumps of one session may share it."""

    up: int = 0
    """From the client to the backend."""
    down: int = 0
    """From the backend to the client."""
    last_up: float = field(default_factory=time.monotonic)
    """When the client last sent bytes on (`time.monotonic()`; the start until then)."""


class _BackendFailed(Exception):
    """The backend failed while the pump used it; the message says how."""


async def pump(
    client: ClientStream, backend: ByteStream, traffic: Traffic, *, grace: float = END_GRACE
) -> Outcome:
    """Copy both ways until the session ends; the caller closes the backend.

    The upload runs in the caller's task and the download in one of its own
    (a task less per idle session). When the download ends first, `_Stop`
    interrupts the upload: at once if the client or the backend failed, after
    `grace` seconds when the backend ended and the client was told.
    """
    down = asyncio.create_task(_down(backend, client, traffic))
    stop = _Stop(asyncio.current_task(), grace)
    down.add_done_callback(stop.down_ended)
    failure = ""
    try:
        await _up(client, backend, traffic)
    except _BackendFailed as exc:
        failure = str(exc)
    except asyncio.CancelledError:
        if not stop.uncancel():
            raise  # not ours: the handler's (the client's connection is gone)
    finally:
        stop.disarm()
        down.remove_done_callback(stop.down_ended)
        down.cancel()
        # wait() never raises the child's cancellation, only our own.
        await asyncio.wait([down])
    outcome = _outcome(down, failure)
    if outcome.ending is Ending.ERROR:
        log.info("%s", outcome.reason)
        await client.abort(outcome.reason)
    return outcome


class _Stop:
    """Cancels the upload's task once the download ended, and owns up to having done so."""

    def __init__(self, task: asyncio.Task[Any] | None, grace: float) -> None:
        assert task is not None, "pump runs in a task"
        self._task = task
        self._grace = grace
        self._timer: asyncio.TimerHandle | None = None
        self._armed = True
        self._fired = False

    def down_ended(self, down: asyncio.Task[Outcome]) -> None:
        if down.cancelled() or not self._armed:
            return
        if down.exception() is None and down.result().ending is Ending.BACKEND:
            # The client was told; its side ends once it has seen that.
            self._timer = asyncio.get_running_loop().call_later(self._grace, self._fire)
        else:
            self._fire()

    def _fire(self) -> None:
        # A callback scheduled before `disarm` may still run: it must not cancel anything.
        if self._armed:
            self._fired = True
            self._task.cancel()

    def uncancel(self) -> bool:
        """True (and the cancellation undone) when the cancellation came from here."""
        if self._fired:
            self._task.uncancel()
        return self._fired

    def disarm(self) -> None:
        self._armed = False
        if self._timer is not None:
            self._timer.cancel()


def _outcome(down: asyncio.Task[Outcome], failure: str) -> Outcome:
    if down.done() and not down.cancelled():
        return down.result()
    if failure:
        return Outcome(Ending.ERROR, failure)
    return Outcome(Ending.CLIENT, "the client went away")


async def _up(client: ClientStream, backend: ByteStream, traffic: Traffic) -> None:
    read, write = _gathered(client, backend)
    eof_sent = False
    while True:
        chunks = await read()
        if chunks:
            if not eof_sent:
                await _to_backend(write(chunks))
                traffic.up += sum(map(len, chunks))
                traffic.last_up = time.monotonic()
        elif client.gone:
            return
        elif not eof_sent:
            await _to_backend(backend.write_eof())
            eof_sent = True


def _gathered(
    client: ClientStream, backend: ByteStream
) -> tuple[Callable[[], Awaitable[list[Chunk]]], Callable[[list[Chunk]], Awaitable[None]]]:
    """How the upload reads and writes: what arrived together leaves together in one
    gathered write when both ends can (nothing joined), else chunk by chunk."""
    # By attribute, not isinstance: a runtime-checked Protocol costs ~9 µs per check.
    if hasattr(client, "read_gathered") and hasattr(backend, "writelines"):
        return cast(Gathering, client).read_gathered, cast(WritesLines, backend).writelines

    async def read() -> list[Chunk]:
        chunk = await client.read()
        return [chunk] if chunk else []

    def write(chunks: list[Chunk]) -> Awaitable[None]:
        return backend.write(cast(bytes, chunks[0]))

    return read, write


async def _to_backend(write: Awaitable[None]) -> None:
    try:
        await write
    except (OSError, RuntimeError) as exc:
        raise _BackendFailed(_failed(exc)) from None


async def _down(backend: ByteStream, client: ClientStream, traffic: Traffic) -> Outcome:
    while True:
        try:
            chunk = await backend.read()
        except (OSError, RuntimeError) as exc:
            return Outcome(Ending.ERROR, _failed(exc))
        if not chunk:
            break
        try:
            await client.write(chunk)
        except (OSError, RuntimeError) as exc:
            # The client vanished: nobody is left to tell.
            log.debug("client write failed: %s", exc)
            return Outcome(Ending.CLIENT, "the client went away")
        traffic.down += len(chunk)
    await client.write_eof()
    return Outcome(Ending.BACKEND, "the backend closed the connection")


_FAILED = "backend connection failed: "


def _failed(exc: BaseException) -> str:
    """How a backend failed, said once: a replica that owns a console relays its own
    pump's reason, which says it already (and a close reason has only 123 bytes)."""
    why = _why(exc)
    return why if why.startswith(_FAILED) else _FAILED + why


def _why(exc: BaseException) -> str:
    """An OS error as its reason (`Connection reset by peer`), anything else as its message."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__
