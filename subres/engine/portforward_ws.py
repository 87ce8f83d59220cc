"""Client streams for port-forward WebSockets: raw ones, and kubelet's multiplexed one.

`RawWebSocket` is one forwarded connection (KubeVirt style): each message is
a chunk (or a datagram), and a client close frame is a half-close: the
backend gets EOF while its replies keep flowing until it ends, then the close
is answered.

`ChannelMux` carries several ports on one channel WebSocket (kubelet style):
it sends each port's first messages, routes client messages to per-port
`PortChannel`s, and closes the WebSocket once every port is done. A port's
failure goes to its error channel as text.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from subres.engine.stream import Chunk
from subres.engine.websocket import CloseCode, WebSocketEnd, whole_message
from subres.engine.wsserver import ServerWebSocket
from subres.protocol import channels
from subres.protocol import portforward_ws as wire
from subres.protocol.channels import Dialect, Framing
from subres.protocol.websocket import Opcode

__all__ = ["HALF_CLOSE_LINGER", "PORT_LINGER", "ChannelMux", "PortChannel", "RawWebSocket"]

log = logging.getLogger(__name__)

HALF_CLOSE_LINGER = 30.0
"""After a client close frame, seconds the backend may take to finish its replies."""
PORT_LINGER = 1.0
"""After a port's backend ended, seconds its client bytes may still flow (containerd's grace)."""
PORT_QUEUE = 4
"""Client messages held per port; a slow port holds up the WebSocket, as kubelet's pipes do."""


class RawWebSocket(WebSocketEnd):
    """A `ClientStream` over a raw binary `ServerWebSocket` made with autoclose off."""

    def __init__(
        self, ws: ServerWebSocket, *, linger: float = HALF_CLOSE_LINGER, stream: bool = False
    ) -> None:
        super().__init__(ws)
        self._linger = linger
        self._stream = stream
        """A byte stream (TCP): hand on pieces as received; else each message is a datagram."""
        self._half_closed = False
        self._ended = asyncio.Event()

    async def read(self) -> bytes:
        """The next bytes; b"" at the client's close frame, and again once it is gone."""
        if self._half_closed:
            # Only our close (after the backend ended) or the linger ends a half-closed client.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ended.wait(), self._linger)
            self._gone = True
            return b""
        while not self.gone:
            piece = await self.ws.receive()
            if piece is None:
                if self.ws.close_received and not self.ws.closed:
                    self._half_closed = True
                else:
                    self._gone = True
                return b""
            if self._stream or piece.text:
                data = piece.data
            else:
                data, _ = await whole_message(self.ws, piece)
            if data:
                return data
        return b""

    async def read_gathered(self) -> list[Chunk]:
        """The next bytes and, for a byte stream, those received after them; [] as `read`'s b""."""
        first = await self.read()
        if not first:
            return []
        return [first, *self.ws.take_ready()] if self._stream else [first]

    async def write(self, data: bytes) -> None:
        """Send `data` as one binary message; waits while the client is slow."""
        try:
            await self.ws.send(data)
        except OSError:
            # The client vanished: a half-closed read must not wait out the linger.
            self._gone = True
            self._ended.set()
            raise

    async def write_eof(self) -> None:
        """The backend ended: close 1000 (this also answers a client's close frame)."""
        await self.close(CloseCode.NORMAL, "the backend closed the connection")

    async def close(self, code: int = CloseCode.NORMAL, reason: str = "") -> None:
        """Send a close frame (truncated reason) and finish; a half-closed read ends."""
        self._ended.set()
        await super().close(code, reason)


class PortChannel:
    """The `ClientStream` of one port on a `ChannelMux`.

    v4 cannot half-close a channel: client input ends only with the
    WebSocket, and a port whose backend ended stops taking input after
    `PORT_LINGER`.
    """

    def __init__(self, mux: ChannelMux, index: int, port: int) -> None:
        self.index = index
        self.port = port
        self._mux = mux
        self._inbox: asyncio.Queue[bytes | None] = asyncio.Queue(PORT_QUEUE)
        self._gone = False
        self.done = False
        """True once the port takes no more input; the mux drops what still comes for it."""
        self._linger: asyncio.TimerHandle | None = None

    @property
    def gone(self) -> bool:
        """True once no more client bytes will come."""
        return self._gone

    async def deliver(self, data: bytes) -> None:
        """Queue client bytes; waits while the port is behind."""
        if not self.done:
            await self._inbox.put(data)

    async def end_input(self) -> None:
        """The WebSocket ended: what is queued still reaches the backend, then EOF."""
        if not self.done:
            await self._inbox.put(None)

    async def read(self) -> bytes:
        """The client's next bytes for this port; b"" once its input ended."""
        if self._gone:
            return b""
        data = await self._inbox.get()
        if data is None:
            self._gone = True
            return b""
        return data

    async def write(self, data: bytes) -> None:
        """Send backend bytes on the port's data channel."""
        await self._mux.send_data(self.index, data)

    async def write_eof(self) -> None:
        """The backend ended: take client input a little longer, as containerd does, then stop."""
        if self._linger is None and not self.done:
            self._linger = asyncio.get_running_loop().call_later(PORT_LINGER, self.finish)

    async def abort(self, reason: str) -> None:
        """Report the failure on the error channel and stop."""
        await self.fail(reason)

    async def fail(self, message: str) -> None:
        """Write `message` to the error channel (as kubelet does) and stop the port."""
        self.finish()
        with contextlib.suppress(OSError, RuntimeError):
            await self._mux.send(wire.error_message(self._mux.dialect, self.index, message))

    async def close(self) -> None:
        """Stop the port (the WebSocket itself is the mux's to close)."""
        self.finish()

    def finish(self) -> None:
        """Stop taking input: queued bytes are dropped and a pending read returns b""."""
        if self._linger is not None:
            self._linger.cancel()
        self.done = True
        while not self._inbox.empty():
            self._inbox.get_nowait()
        self._inbox.put_nowait(None)


class ChannelMux:
    """Several forwarded ports on one channel `ServerWebSocket` (binary ones with `prefix`)."""

    def __init__(self, ws: ServerWebSocket, dialect: Dialect, ports: Sequence[int]) -> None:
        self.ws = ws
        self.dialect = dialect
        self.ports = [PortChannel(self, index, port) for index, port in enumerate(ports)]

    @property
    def close_code(self) -> int | None:
        """The close code sent or received, once the WebSocket closed."""
        return self.ws.close_code

    async def hello(self) -> None:
        """Name each port on its data and error channels, in kubelet's order."""
        for message in wire.hello(self.dialect, [p.port for p in self.ports]):
            await self.send(message)

    async def receive(self) -> None:
        """Route client messages to their ports until the WebSocket ends, then end their input."""
        binary = self.dialect.framing is Framing.BINARY
        try:
            while (piece := await self.ws.receive()) is not None:
                if binary and not piece.text:
                    # Port data is a byte stream: pieces go on as they came.
                    channel = piece.channel
                    if piece.data and channel % 2 == 0 and 0 <= channel < 2 * len(self.ports):
                        await self.ports[channel // 2].deliver(piece.data)
                    continue
                message, _ = await whole_message(self.ws, piece)
                try:
                    event = wire.decode(self.dialect, message, port_count=len(self.ports))
                except channels.ChannelError as exc:
                    await self.close(CloseCode.PROTOCOL_ERROR, str(exc))
                    break
                if event is not None and event.data:
                    await self.ports[event.index].deliver(event.data)
        finally:
            await self._end_input(clean=self.ws.close_received)

    async def _end_input(self, *, clean: bool) -> None:
        for port in self.ports:
            if clean:
                # What the client sent before its close frame still reaches the backend.
                await port.end_input()
            else:
                port.finish()

    async def send(self, message: bytes | str) -> None:
        """One message; waits while the client is slow."""
        if isinstance(message, str):
            await self.ws.send(message.encode(), Opcode.TEXT)
        else:
            await self.ws.send(message)

    async def send_data(self, index: int, data: bytes) -> None:
        """Bytes for the port at `index` on its data channel."""
        if self.dialect.framing is Framing.BINARY:
            await self.ws.send_channel(wire.data_channel(index), data)
        else:
            await self.send(wire.data_message(self.dialect, index, data))

    async def close(self, code: int = CloseCode.NORMAL, reason: str = "") -> None:
        """Close the WebSocket; every port's input ends."""
        await self.ws.close(code, reason)
