"""The client side of a session over the server's WebSocket (`subres.engine.wsserver`).

Turns a negotiated channel dialect (raw, binary channels or base64 channels)
into the `ClientStream` the pump reads and writes: stdin arrives as bytes,
resize messages go to a callback, stdout leaves framed, and the session's end
becomes a close frame with a code and a reason. Raw and binary-channel stdin
is handed on in the pieces the connection received it in, never joined.
"""

from __future__ import annotations

import json

from subres.engine.stream import Chunk, Terminal
from subres.engine.wsserver import Piece, ServerWebSocket
from subres.kube.status import exited
from subres.protocol import channels
from subres.protocol.channels import ChannelClosed, ChannelError, Dialect, Framing
from subres.protocol.websocket import CloseCode, Opcode

__all__ = [
    "CloseCode",
    "ServerMessages",
    "WebSocketClient",
    "WebSocketEnd",
    "whole_message",
]


async def whole_message(ws: ServerWebSocket, piece: Piece) -> tuple[bytes, Piece]:
    """`piece`'s message whole (with the channel byte of a prefixed one), and its last piece."""
    parts = [piece.data]
    while not piece.last:
        more = await ws.receive()
        if more is None:
            break
        piece = more
        parts.append(piece.data)
    data = parts[0] if len(parts) == 1 else b"".join(parts)
    if piece.channel >= 0 and not piece.text:
        data = bytes((piece.channel,)) + data
    return data, piece


class WebSocketEnd:
    """What every client side over a `ServerWebSocket` shares: its state and close."""

    __slots__ = ("_gone", "ws")

    def __init__(self, ws: ServerWebSocket) -> None:
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
        await self.ws.close(code, reason)


class WebSocketClient(WebSocketEnd):
    """A console's `ClientStream` over a `ServerWebSocket`, in a channel dialect.

    The WebSocket must take binary messages' first byte apart (`prefix`)
    exactly when the dialect frames in binary channels.
    """

    __slots__ = ("dialect", "terminal")

    def __init__(
        self,
        ws: ServerWebSocket,
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
            await self._send(channels.STDOUT, b"")

    async def read(self) -> bytes:
        """The next stdin bytes; b"" on stdin close (v5) or when the client is gone."""
        framing = self.dialect.framing
        while not self.gone:
            piece = await self.ws.receive()
            if piece is None:
                self._gone = True
                break
            if framing is Framing.RAW or (
                piece.channel == channels.STDIN and framing is Framing.BINARY
            ):
                if piece.data:
                    return piece.data
                continue
            message, piece = await whole_message(self.ws, piece)
            try:
                event = channels.decode(self.dialect, message)
            except ChannelError as exc:
                await self.close(CloseCode.PROTOCOL_ERROR, str(exc))
                break
            if isinstance(event, ChannelClosed):
                if event.channel == channels.STDIN:
                    return b""
            elif event.channel == channels.STDIN and event.data:
                return event.data
            elif event.channel == channels.RESIZE and self.terminal is not None:
                self.terminal.resized(event.data)
        return b""

    async def read_gathered(self) -> list[Chunk]:
        """The next stdin bytes and those received after them, as received; [] as `read`'s b""."""
        first = await self.read()
        if not first:
            return []
        framing = self.dialect.framing
        if framing is Framing.RAW:
            return [first, *self.ws.take_ready()]
        if framing is Framing.BINARY:
            return [first, *self.ws.take_ready(channels.STDIN)]
        return [first]

    async def write(self, data: bytes) -> None:
        """Send backend output on stdout; waits while the client is slow."""
        await self._send(channels.STDOUT, data)

    async def write_eof(self) -> None:
        """The backend ended: report its exit status on the error channel (v4+), then close 1000."""
        if self.dialect.status:
            code = self.terminal.exit_code() if self.terminal is not None else None
            body = json.dumps(exited(code), separators=(",", ":")).encode()
            await self._send(channels.ERROR, body)
        await self.close(CloseCode.NORMAL, "the backend closed the connection")

    async def _send(self, channel: int, data: bytes) -> None:
        framing = self.dialect.framing
        if framing is Framing.RAW:
            await self.ws.send(data)
        elif framing is Framing.BINARY:
            await self.ws.send_channel(channel, data)
        else:
            text = channels.encode(self.dialect, channel, data)
            await self.ws.send(str(text).encode(), Opcode.TEXT)


class ServerMessages:
    """`tunnel.Messages` over the server's WebSocket: binary payloads in the pieces received."""

    def __init__(self, ws: ServerWebSocket) -> None:
        self.ws = ws

    async def next_binary(self) -> bytes | None:
        piece = await self.ws.receive()
        return None if piece is None or piece.text else piece.data

    async def send_binary(self, data: bytes) -> None:
        await self.ws.send(data)

    async def close_normally(self) -> None:
        await self.ws.close(CloseCode.NORMAL)
