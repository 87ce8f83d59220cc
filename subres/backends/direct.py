"""The direct dial: a vetted endpoint reached from this process, as a stream or datagrams.

Shared by the replica (endpoints that are not node-local) and the node agent
(every endpoint it relays), so both dial the same way.
"""

from __future__ import annotations

from subres.backends import datagram
from subres.backends import stream as sockets
from subres.backends.endpoint import Target
from subres.engine.stream import ByteStream

__all__ = ["dial"]


async def dial(
    target: Target, *, udp: bool, connect_timeout: float, read_size: int, write_timeout: float
) -> ByteStream:
    """A connected UDP socket or a stream socket; `BackendUnavailable` when it cannot be."""
    if udp:
        return await datagram.dial(target)
    return await sockets.dial(
        target, connect_timeout=connect_timeout, read_size=read_size, write_timeout=write_timeout
    )
