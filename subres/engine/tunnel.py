"""SPDY tunnelled in a WebSocket (`SPDY/3.1+portforward.k8s.io`): the server's carrier.

kubectl 1.31 and later send port-forward's SPDY byte stream in binary
WebSocket messages; `WebSocketCarrier` gives `subres.engine.spdy` that byte
stream over an upgraded aiohttp WebSocket.
"""

from __future__ import annotations

import contextlib

from aiohttp import WSMsgType, web

from subres.engine import internals, upgrade
from subres.engine.spdy import WRITE_CHUNK
from subres.engine.websocket import CloseCode

__all__ = ["WebSocketCarrier"]


class WebSocketCarrier:
    """SPDY tunnelled in a WebSocket (`SPDY/3.1+portforward.k8s.io`).

    Binary messages carry the byte stream; their boundaries mean nothing.
    A close (1000) is EOF.
    """

    def __init__(self, ws: web.WebSocketResponse) -> None:
        self.ws = ws
        self._ended = False

    async def read(self) -> bytes:
        """The payloads of the binary messages that arrived, up to about `WRITE_CHUNK` bytes.

        Waits for one non-empty message, then takes those already received
        (client-go sends a frame's header and payload as separate small
        messages). b"" on close or anything else.
        """
        parts: list[bytes] = []
        size = 0
        while not self._ended and not self.ws.closed:
            if parts and (size >= WRITE_CHUNK or not internals.binary_queued(self.ws)):
                break
            msg = await self.ws.receive()
            if msg.type is not WSMsgType.BINARY:
                self._ended = True
                break
            if msg.data:
                parts.append(bytes(msg.data))
                size += len(msg.data)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def write(self, data: bytes) -> None:
        """One binary message."""
        await self.ws.send_bytes(data)

    async def close(self) -> None:
        """Let the peer close first (within `CLOSE_LINGER`), then close with 1000."""
        await upgrade.linger(self.read)
        with contextlib.suppress(OSError, RuntimeError):
            await self.ws.close(code=CloseCode.NORMAL)
