"""Socket backends (tcp, unix) as `SocketStream`s, and dial errors."""

from __future__ import annotations

import asyncio

from subres.backends.endpoint import Target
from subres.engine.sockets import SocketStream

__all__ = ["BackendUnavailable", "dial"]


class BackendUnavailable(Exception):
    """The backend could not be reached; the message says why."""

    code = 503
    """The HTTP status to answer with (a node agent may refuse with 403 or fail with 502)."""

    def __init__(self, message: str = "", code: int | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


async def dial(
    target: Target, *, connect_timeout: float, read_size: int, write_timeout: float
) -> SocketStream:
    """Connect to a vetted target within `connect_timeout` seconds."""
    ep = target.endpoint
    loop = asyncio.get_running_loop()

    def protocol() -> SocketStream:
        return SocketStream(high_water=4 * read_size, write_timeout=write_timeout)

    try:
        async with asyncio.timeout(connect_timeout):
            if ep.scheme == "unix":
                _, stream = await loop.create_unix_connection(protocol, ep.path)
            else:
                _, stream = await loop.create_connection(protocol, target.address, ep.port)
    except TimeoutError:
        message = f"connecting to {ep} timed out after {connect_timeout:g}s"
        raise BackendUnavailable(message) from None
    except OSError as exc:
        raise BackendUnavailable(f"cannot connect to {ep}: {exc.strerror or exc}") from None
    return stream
