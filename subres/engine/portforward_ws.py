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

from aiohttp import WSMsgType, web

from subres.engine.websocket import CloseCode, WebSocketEnd, close_websocket, take_queued
from subres.protocol import channels
from subres.protocol import portforward_ws as wire
from subres.protocol.channels import Dialect

__all__ = ["HALF_CLOSE_LINGER", "PORT_LINGER", "ChannelMux", "PortChannel", "RawWebSocket"]

log = logging.getLogger(__name__)

HALF_CLOSE_LINGER = 30.0
"""After a client close frame, seconds the backend may take to finish its replies."""
PORT_LINGER = 1.0
"""After a port's backend ended, seconds its client bytes may still flow (containerd's grace)."""
PORT_QUEUE = 4
"""Client messages held per port; a slow port holds up the WebSocket, as kubelet's pipes do."""

_ENDED = frozenset({WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR})


class RawWebSocket(WebSocketEnd):
    """A `ClientStream` over a prepared raw binary `WebSocketResponse` made with autoclose off."""

    def __init__(
        self, ws: web.WebSocketResponse, *, linger: float = HALF_CLOSE_LINGER, batch: bool = False
    ) -> None:
        super().__init__(ws)
        self._linger = linger
        self._batch = batch
        """A byte stream (TCP): join messages already received into one read."""
        self._half_closed = False
        self._ended = asyncio.Event()

    async def read(self) -> bytes:
        """The next message's bytes; b"" at the client's close frame, and again once it is gone."""
        if self._half_closed:
            # Only our close (after the backend ended) or the linger ends a half-closed client.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ended.wait(), self._linger)
            self._gone = True
            return b""
        while not self.gone:
            msg = await self.ws.receive()
            if msg.type is WSMsgType.BINARY and msg.data:
                if not self._batch:
                    return bytes(msg.data)
                data, ended = await take_queued(self.ws, bytes(msg.data))
                self._gone = self._gone or ended
                return data
            if msg.type is WSMsgType.TEXT and msg.data:
                return str(msg.data).encode()
            if msg.type is WSMsgType.CLOSE:
                self._half_closed = True
                return b""
            if msg.type in _ENDED:
                self._gone = True
        return b""

    async def write(self, data: bytes) -> None:
        """Send `data` as one binary message; waits while the client is slow."""
        try:
            await self.ws.send_bytes(data)
        except (OSError, RuntimeError):
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
        await self._mux.send(wire.data_message(self._mux.dialect, self.index, data))

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
    """Several forwarded ports on one prepared channel `WebSocketResponse`."""

    def __init__(self, ws: web.WebSocketResponse, dialect: Dialect, ports: Sequence[int]) -> None:
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
        clean = False
        try:
            while not self.ws.closed:
                msg = await self.ws.receive()
                if msg.type not in (WSMsgType.BINARY, WSMsgType.TEXT):
                    clean = msg.type is WSMsgType.CLOSE
                    break
                try:
                    event = wire.decode(self.dialect, msg.data, port_count=len(self.ports))
                except channels.ChannelError as exc:
                    await self.close(CloseCode.PROTOCOL_ERROR, str(exc))
                    break
                if event is not None and event.data:
                    await self.ports[event.index].deliver(event.data)
        finally:
            await self._end_input(clean=clean)

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
            await self.ws.send_str(message)
        else:
            await self.ws.send_bytes(message)

    async def close(self, code: int = CloseCode.NORMAL, reason: str = "") -> None:
        """Close the WebSocket; every port's input ends."""
        await close_websocket(self.ws, code, reason)
