"""The one WebSocket carrier: a byte stream in binary WebSocket messages, for either end.

kubectl 1.31 and later send port-forward's SPDY byte stream in binary
WebSocket messages (`SPDY/3.1+portforward.k8s.io`). `WebSocketCarrier` turns
any `Messages` (the server's WebSocket through
`subres.engine.websocket.ServerMessages`, the CLI's `ClientWebSocket` as it
is) into the byte carrier `subres.engine.spdy` runs over. Message boundaries
mean nothing, so payloads go on as they were received, never joined; a close
(or anything but binary) is the end.
"""

from __future__ import annotations

from typing import Protocol

from subres.engine.stream import linger

__all__ = ["Messages", "WebSocketCarrier"]


class Messages(Protocol):
    """A WebSocket as the carrier sees it."""

    async def next_binary(self) -> bytes | None:
        """The next message's payload if it is binary; None at the end or for anything else."""
        ...

    async def send_binary(self, data: bytes) -> None:
        """Send one binary message."""
        ...

    async def close_normally(self) -> None:
        """Close with 1000; a peer already gone is fine."""
        ...


class WebSocketCarrier:
    """A byte stream carried in binary messages of `messages`.

    The server lets its peer close first (`linger`): a Go client that meets
    our close drops what it read but did not hand out. The client closes at
    once and waits for the server's answer.
    """

    def __init__(self, messages: Messages, *, linger: bool) -> None:
        self.messages = messages
        self._linger = linger
        self._ended = False

    async def read(self) -> bytes:
        """The next binary payload as it was received (a message or a piece of one, never
        joined: the SPDY parser takes chunks of any size); b"" at the end."""
        while not self._ended:
            data = await self.messages.next_binary()
            if data is None:
                self._ended = True
            elif data:
                return data
        return b""

    async def write(self, data: bytes) -> None:
        """One binary message."""
        await self.messages.send_binary(data)

    async def close(self) -> None:
        """Close with 1000; when lingering, after the peer closed (within `CLOSE_LINGER`)."""
        if self._linger:
            await linger(self.read)
        await self.messages.close_normally()
