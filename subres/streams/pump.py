"""The pump: joins a client stream and a backend stream until one side ends.

Backpressure comes from awaiting each write before the next read. The
backend's EOF ends the session (the client is told with `write_eof`); the
client going away ends it too; a client half-close reaches the backend as EOF
while replies keep flowing back.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from typing import Protocol

from subres.backends.stream import ByteStream

__all__ = ["ClientStream", "Ending", "pump"]

log = logging.getLogger(__name__)


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


class Ending(enum.Enum):
    """Who ended a session."""

    BACKEND = "backend"
    CLIENT = "client"
    ERROR = "error"


async def pump(client: ClientStream, backend: ByteStream) -> Ending:
    """Copy both ways until the session ends; the caller closes the backend."""
    down = asyncio.create_task(_down(backend, client))
    try:
        await _up(client, backend)
    except (OSError, RuntimeError) as exc:
        log.info("backend write failed: %s", exc)
        await client.abort(f"backend connection failed: {exc}")
        return Ending.ERROR
    finally:
        down.cancel()
        # wait() never raises the child's cancellation, only our own.
        await asyncio.wait([down])
    return Ending.CLIENT if down.cancelled() else down.result()


async def _up(client: ClientStream, backend: ByteStream) -> None:
    eof_sent = False
    while True:
        chunk = await client.read()
        if chunk:
            if not eof_sent:
                await backend.write(chunk)
        elif client.gone:
            return
        elif not eof_sent:
            await backend.write_eof()
            eof_sent = True


async def _down(backend: ByteStream, client: ClientStream) -> Ending:
    try:
        while chunk := await backend.read():
            await client.write(chunk)
    except (OSError, RuntimeError) as exc:
        # Writing to a client that vanished: its reader sees the loss and ends the session.
        log.debug("client write failed: %s", exc)
        return Ending.CLIENT
    await client.write_eof()
    return Ending.BACKEND
