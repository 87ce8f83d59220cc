"""The client side of a session over an upgraded aiohttp WebSocket.

Turns a negotiated channel dialect (raw, binary channels or base64 channels)
into the `ClientStream` the pump reads and writes: stdin arrives as bytes,
resize messages go to a callback, stdout leaves framed, and the session's end
becomes a close frame with a code and a reason.
"""

from __future__ import annotations

import contextlib
import json
import logging

from aiohttp import WSMsgType, web

from subres.engine import internals
from subres.engine.stream import Terminal
from subres.kube.status import exited
from subres.protocol import channels
from subres.protocol.channels import ChannelClosed, ChannelError, Dialect, Framing

__all__ = [
    "BATCH",
    "CloseCode",
    "ServerMessages",
    "WebSocketClient",
    "WebSocketEnd",
    "close_websocket",
    "take_queued",
]

log = logging.getLogger(__name__)

MAX_REASON = 123
"""A close frame's reason is at most 123 bytes (RFC 6455 5.5)."""
BATCH = 256 * 1024
"""Most bytes of already-received raw messages joined into one read."""


async def take_queued(
    ws: web.WebSocketResponse, first: bytes, limit: int = BATCH
) -> tuple[bytes, bool]:
    """`first` joined with the binary messages already received, up to about `limit` bytes.

    For byte streams whose message boundaries mean nothing: several messages
    make one backend write. The second value is True when the WebSocket
    turned out closing or closed (aiohttp answers a queued read with that
    once it is): the caller treats the client as gone, as its read would.
    """
    parts = [first]
    size = len(first)
    ended = False
    while size < limit and internals.binary_queued(ws):
        msg = await ws.receive()  # queued: returns without waiting
        if msg.type is not WSMsgType.BINARY:
            ended = True
            break
        parts.append(bytes(msg.data))
        size += len(msg.data)
    return (first if len(parts) == 1 else b"".join(parts)), ended


class CloseCode:
    """Close codes subres sends."""

    NORMAL = 1000
    GOING_AWAY = 1001
    PROTOCOL_ERROR = 1002
    POLICY_VIOLATION = 1008
    INTERNAL_ERROR = 1011
    TAKEN_OVER = 4001
    FELL_BEHIND = 4002
    """An observer that read the console too slowly was cut off."""
    RECORDING_FAILED = 4003
    """The session's required recording stopped being writable (`record: required`)."""
    MAX_DURATION = 4004
    """The session reached the longest a limit lets it last (`maxSessionDuration`)."""
    IDLE = 4005
    """The session went without input for as long as a limit allows (`idleTimeout`)."""
    MODERATOR_ENDED = 4006
    """A moderator ended the moderated session."""
    MODERATOR_LEFT = 4007
    """The moderators left a session whose policy says `onLeave: terminate`."""


async def close_websocket(ws: web.WebSocketResponse, code: int, reason: str) -> None:
    """Send a close frame with `code` and `reason` (truncated to fit); a gone peer is fine."""
    try:
        await ws.close(code=code, message=reason.encode()[:MAX_REASON])
    except (OSError, RuntimeError) as exc:
        log.debug("close failed: %s", exc)


class WebSocketEnd:
    """What every client side over a prepared `WebSocketResponse` shares: its state and close."""

    __slots__ = ("_gone", "ws")

    def __init__(self, ws: web.WebSocketResponse) -> None:
        self.ws = ws
        self._gone = False

    @property
    def gone(self) -> bool:
        """True once nothing can flow either way."""
        return self._gone or self.ws.closed

    @property
    def close_code(self) -> int | None:
        """The close code sent or received, once the WebSocket closed."""
        return self.ws.close_code

    async def abort(self, reason: str) -> None:
        """Close with 1011 and `reason`."""
        await self.close(CloseCode.INTERNAL_ERROR, reason)

    async def close(self, code: int = CloseCode.NORMAL, reason: str = "") -> None:
        """Send a close frame with `code` and `reason` and finish."""
        self._gone = True
        await close_websocket(self.ws, code, reason)


class WebSocketClient(WebSocketEnd):
    """A console's `ClientStream` over a prepared `WebSocketResponse`, in a channel dialect."""

    __slots__ = ("dialect", "terminal")

    def __init__(
        self,
        ws: web.WebSocketResponse,
        dialect: Dialect,
        *,
        terminal: Terminal | None = None,
    ) -> None:
        super().__init__(ws)
        self.dialect = dialect
        self.terminal = terminal

    async def hello(self) -> None:
        """Tell channel clients the stream is up: an empty message on stdout, as kubelet does."""
        if self.dialect.framing is not Framing.RAW:
            await self._send(channels.encode(self.dialect, channels.STDOUT, b""))

    async def read(self) -> bytes:
        """The next stdin bytes; b"" on stdin close (v5) or when the client is gone."""
        while not self.gone:
            msg = await self.ws.receive()
            if msg.type not in (WSMsgType.BINARY, WSMsgType.TEXT):
                self._gone = True
                break
            try:
                event = channels.decode(self.dialect, msg.data)
            except ChannelError as exc:
                await self.close(CloseCode.PROTOCOL_ERROR, str(exc))
                break
            if isinstance(event, ChannelClosed):
                if event.channel == channels.STDIN:
                    return b""
            elif event.channel == channels.STDIN and event.data:
                if self.dialect.framing is Framing.RAW:
                    return await self._more(bytes(event.data))
                return event.data
            elif event.channel == channels.RESIZE and self.terminal is not None:
                self.terminal.resized(event.data)
        return b""

    async def _more(self, data: bytes) -> bytes:
        """`data` and the raw messages already received after it: one backend write."""
        data, ended = await take_queued(self.ws, data)
        if ended:
            self._gone = True
        return data

    async def write(self, data: bytes) -> None:
        """Send backend output on stdout; waits while the client is slow."""
        await self._send(channels.encode(self.dialect, channels.STDOUT, data))

    async def write_eof(self) -> None:
        """The backend ended: report its exit status on the error channel (v4+), then close 1000."""
        if self.dialect.status:
            code = self.terminal.exit_code() if self.terminal is not None else None
            body = json.dumps(exited(code), separators=(",", ":")).encode()
            await self._send(channels.encode(self.dialect, channels.ERROR, body))
        await self.close(CloseCode.NORMAL, "the backend closed the connection")

    async def _send(self, message: bytes | str) -> None:
        if isinstance(message, str):
            await self.ws.send_str(message)
        else:
            await self.ws.send_bytes(message)


class ServerMessages:
    """`Messages` over the server's aiohttp `WebSocketResponse`."""

    def __init__(self, ws: web.WebSocketResponse) -> None:
        self.ws = ws

    async def next_binary(self) -> bytes | None:
        if self.ws.closed:
            return None
        msg = await self.ws.receive()
        return bytes(msg.data) if msg.type is WSMsgType.BINARY else None

    def binary_ready(self) -> bool:
        return internals.binary_queued(self.ws)

    async def send_binary(self, data: bytes) -> None:
        await self.ws.send_bytes(data)

    async def close_normally(self) -> None:
        with contextlib.suppress(OSError, RuntimeError):
            await self.ws.close(code=CloseCode.NORMAL)
