"""The server's end of a WebSocket, read straight from its socket into one shared buffer.

aiohttp parses the upgrade request; `WebSocketUpgrade.accept` answers the 101
and takes the connection's transport over with a `ServerWebSocket`, an
asyncio buffered protocol (on asyncio's loop and on uvloop, with TLS or
without). Every
connection of a thread reads into the same preallocated buffer: a read and
its parsing happen in one synchronous callback, so an idle connection holds
no buffer at all, only the few bytes of a frame header that a read cut
(`protocol.websocket.MAX_LEFTOVER`). Frames are parsed where they lie
(`protocol.websocket.FrameDecoder`) and each payload span is unmasked by a
C routine straight into the bytes handed on: the one pass over the payload
that masking makes unavoidable, and no other copy.

Binary messages are handed on in pieces as they arrive, so a byte stream
never waits for a whole message nor joins one; text messages, which must be
checked as UTF-8, are handed on whole. With `prefix` (the channel dialects)
the first byte of each binary message is taken apart as its channel.

Pings are answered at once, a silent peer is pinged after `ping_interval`
seconds and dropped if it stays silent half as long again, a client's close
frame ends the input (answered at once, or later by the caller when
`autoclose` is off: a half-close), and reading pauses while more than
`HIGH_WATER` bytes wait to be read. Writes wait while the transport's buffer
is above its high-water mark.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import hashlib
import logging
import threading
from dataclasses import dataclass, field
from typing import NamedTuple, cast

from aiohttp import hdrs, web

from subres.engine import internals
from subres.engine.stream import Chunk
from subres.engine.upgrade import switch
from subres.protocol.websocket import (
    MAX_LEFTOVER,
    CloseCode,
    ControlReceived,
    DataReceived,
    FrameDecoder,
    Opcode,
    ProtocolError,
    close_payload,
    decode_text,
    frame_header,
    parse_close,
)

__all__ = [
    "CLOSE_TIMEOUT",
    "HIGH_WATER",
    "READ_BUFFER",
    "Piece",
    "ServerWebSocket",
    "WebSocketUpgrade",
    "accept_key",
]

log = logging.getLogger(__name__)

READ_BUFFER = 256 * 1024
"""Bytes of the buffer every connection of a thread reads into."""
HIGH_WATER = 256 * 1024
"""Bytes received and not yet read before the socket stops reading."""
CLOSE_TIMEOUT = 10.0
"""Seconds our close frame waits for the client's before the connection is dropped."""
SMALL = 1024
"""Payloads up to this size leave joined to their header; larger ones beside it, gathered
(`writelines`: one `writev` on uvloop and, from Python 3.12, on asyncio's loop)."""
GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
"""RFC 6455 4.2.2: what the client's key is hashed with."""

_shared = threading.local()


def _read_buffer() -> memoryview:
    view: memoryview | None = getattr(_shared, "view", None)
    if view is None:
        view = _shared.view = memoryview(bytearray(READ_BUFFER))
    return view


class Piece(NamedTuple):
    """Received payload: a piece of a binary message, or a whole text message."""

    data: bytes
    text: bool
    channel: int
    """With `prefix`: the binary message's first byte, on each of its pieces; else -1.
    -1 also for an empty binary message, which has no channel byte."""
    last: bool
    """The message's last piece."""


def accept_key(key: str) -> str:
    """The `Sec-WebSocket-Accept` answering a client's `Sec-WebSocket-Key`."""
    return base64.b64encode(hashlib.sha1(key.encode() + GUID).digest()).decode()


@dataclass
class WebSocketUpgrade:
    """The answer to a checked WebSocket upgrade request, to `accept` once the session starts."""

    subprotocol: str
    """The subprotocol chosen; "" for none."""
    max_message: int
    ping_interval: float | None
    prefix: bool = False
    """Binary messages start with a channel byte (`Piece.channel`)."""
    autoclose: bool = True
    """Answer a client's close frame at once; else the caller's `close` answers it."""
    headers: list[tuple[str, str]] = field(default_factory=list)
    """More headers for the 101 (a Warning, say)."""

    async def accept(self, request: web.Request) -> tuple[web.StreamResponse, ServerWebSocket]:
        """Answer 101 and take the connection over."""
        answer = [
            (hdrs.UPGRADE, "websocket"),
            (hdrs.CONNECTION, "upgrade"),
            (hdrs.SEC_WEBSOCKET_ACCEPT, accept_key(request.headers[hdrs.SEC_WEBSOCKET_KEY])),
            *([(hdrs.SEC_WEBSOCKET_PROTOCOL, self.subprotocol)] if self.subprotocol else []),
            *self.headers,
        ]
        ws = ServerWebSocket(
            max_message=self.max_message,
            ping_interval=self.ping_interval,
            prefix=self.prefix,
            autoclose=self.autoclose,
        )
        response = await switch(request, answer, ws)
        if request.transport is None:
            raise ConnectionResetError("the client went away during the upgrade")
        ws.take(request.transport)
        return response, ws


class ServerWebSocket(asyncio.BufferedProtocol):
    """One client's WebSocket, from the 101 on; see the module docstring."""

    __slots__ = (
        "_autoclose",
        "_close_received",
        "_close_sent",
        "_closed_waiter",
        "_decoder",
        "_drained",
        "_heard",
        "_inner",
        "_input_ended",
        "_leftover",
        "_lost",
        "_paused",
        "_pieces",
        "_ping_interval",
        "_pinged",
        "_prefix",
        "_queued",
        "_readable",
        "_text",
        "_timer",
        "_transport",
        "_write_paused",
        "channel",
        "close_code",
    )

    def __init__(
        self,
        *,
        max_message: int,
        ping_interval: float | None,
        prefix: bool,
        autoclose: bool,
    ) -> None:
        self.close_code: int | None = None
        """The code of the first close frame, sent or received; 1006 if the connection
        ended without one."""
        self.channel = -1
        """The channel of the binary message being received (with `prefix`)."""
        self._decoder = FrameDecoder(max_message=max_message)
        self._ping_interval = ping_interval
        self._prefix = prefix
        self._autoclose = autoclose
        self._transport: asyncio.Transport | None = None
        self._inner: asyncio.BaseProtocol | None = None
        self._leftover = b""
        self._text: list[bytes] = []
        self._pieces: collections.deque[Piece] = collections.deque()
        self._queued = 0
        self._paused = False
        self._readable: asyncio.Future[None] | None = None
        self._drained: asyncio.Future[None] | None = None
        self._closed_waiter: asyncio.Future[None] | None = None
        self._write_paused = False
        self._input_ended = False
        self._close_sent = False
        self._close_received = False
        self._lost = False
        self._heard = False
        self._pinged = False
        self._timer: asyncio.TimerHandle | None = None

    # -- taking the connection over ----------------------------------------------------

    def take(self, transport: asyncio.BaseTransport) -> None:
        """Become the transport's protocol; the one before still hears of its end."""
        # uvloop's transports are not subclasses of asyncio.Transport, only alike.
        self._transport = cast(asyncio.Transport, transport)
        self._inner = transport.get_protocol()
        transport.set_protocol(self)
        if self._ping_interval:
            self._arm(self._ping_interval)

    def feed_data(self, data: bytes) -> tuple[bool, bytes]:
        """Bytes aiohttp read past the request (a client that did not wait for the 101)."""
        for start in range(0, len(data), READ_BUFFER - MAX_LEFTOVER):
            piece = data[start : start + READ_BUFFER - MAX_LEFTOVER]
            buffer = self.get_buffer(len(piece))
            buffer[: len(piece)] = piece
            self.buffer_updated(len(piece))
        return False, b""

    def feed_eof(self) -> None:
        """aiohttp's end of the connection: ours comes through `connection_lost`."""

    # -- the protocol: reading -------------------------------------------------------

    def get_buffer(self, sizehint: int) -> memoryview:
        """The shared buffer, after the bytes the last read left unparsed."""
        view = _read_buffer()
        kept = len(self._leftover)
        if kept:
            view[:kept] = self._leftover
        return view[kept:]

    def buffer_updated(self, nbytes: int) -> None:
        """Parse what arrived, unmask each payload into bytes, answer control frames."""
        self._heard = True
        if self._input_ended:
            return
        view = _read_buffer()
        end = len(self._leftover) + nbytes
        try:
            events, consumed = self._decoder.feed(view[:end])
            for event in events:
                if isinstance(event, ControlReceived):
                    self._control(
                        event.opcode, internals.unmask(view[event.start : event.stop], event.mask)
                    )
                elif event.opcode is Opcode.BINARY:
                    self._binary(view, event)
                else:
                    self._text_piece(
                        internals.unmask(view[event.start : event.stop], event.mask), event.last
                    )
        except ProtocolError as exc:
            self._fail(exc.code, exc.reason)
            return
        self._leftover = bytes(view[consumed:end]) if consumed < end else b""
        if self._queued > HIGH_WATER and not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()

    def _binary(self, view: memoryview, event: DataReceived) -> None:
        if self._close_sent:
            return
        start, stop, mask, last = event.start, event.stop, event.mask, event.last
        if self._prefix:
            if event.first:
                self.channel = -1
            if self.channel < 0 and start < stop:
                self.channel = view[start] ^ mask[0]
                start += 1
                mask = mask[1:] + mask[:1]
        data = internals.unmask(view[start:stop], mask) if start < stop else b""
        if data or last:
            self._queue(Piece(data, False, self.channel, last))

    def _text_piece(self, data: bytes, last: bool) -> None:
        self._text.append(data)
        if last:
            parts, self._text = self._text, []
            whole = parts[0] if len(parts) == 1 else b"".join(parts)
            decode_text(whole)
            if not self._close_sent:
                self._queue(Piece(whole, True, -1, True))

    def _queue(self, piece: Piece) -> None:
        self._pieces.append(piece)
        self._queued += len(piece.data)
        _wake(self._readable)

    def _control(self, opcode: Opcode, payload: bytes) -> None:
        if opcode is Opcode.PING:
            if not self._close_sent:
                self._write(frame_header(Opcode.PONG, len(payload)) + payload)
        elif opcode is Opcode.CLOSE:
            code, _ = parse_close(payload)
            self._close_received = True
            self._end_input()
            if self.close_code is None:
                self.close_code = code
            if self._close_sent:
                self._finish()
            elif self._autoclose:
                answer = code if code not in (CloseCode.NO_STATUS, CloseCode.ABNORMAL) else 1000
                self._send_close(answer, "")
                self._finish()

    def _fail(self, code: CloseCode, reason: str) -> None:
        """The client broke the protocol: close with `code`, drop the connection."""
        log.info("closing a WebSocket: %s", reason)
        self._end_input()
        self._drop_input()
        self._send_close(code, reason)
        self._finish()

    def _end_input(self) -> None:
        self._input_ended = True
        self._leftover = b""
        _wake(self._readable)

    def _finish(self) -> None:
        """Both close frames are out (or it failed): the server hangs up first (RFC 6455 7.1.1)."""
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()

    def eof_received(self) -> bool:
        """The client half-closed TCP without a close frame: the connection is done."""
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        """The connection is gone: every waiter wakes; aiohttp's protocol hears of it too."""
        self._lost = True
        if self.close_code is None:
            self.close_code = CloseCode.ABNORMAL
        if self._timer is not None:
            self._timer.cancel()
        self._end_input()
        _wake(self._drained)
        _wake(self._closed_waiter)
        if self._inner is not None:
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        """The transport's buffer is above its high-water mark."""
        self._write_paused = True
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        """The transport's buffer drained."""
        self._write_paused = False
        _wake(self._drained)
        if self._inner is not None:
            self._inner.resume_writing()

    # -- the caller's side -----------------------------------------------------------

    @property
    def input_ended(self) -> bool:
        """No more input will come: a close frame arrived, ours left, or the connection ended."""
        return self._input_ended or self._close_sent

    @property
    def close_received(self) -> bool:
        """The client's close frame arrived."""
        return self._close_received

    @property
    def closed(self) -> bool:
        """Nothing can flow either way any more."""
        return self._lost or (self._close_sent and self._close_received) or self._transport is None

    def take_ready(self, channel: int | None = None) -> list[Chunk]:
        """The binary pieces received and not yet read, up to the first text message
        (or, given `channel`, the first piece of another channel); empty ones dropped."""
        pieces = self._pieces
        taken: list[Chunk] = []
        while pieces and not pieces[0].text and channel in (None, pieces[0].channel):
            data = pieces.popleft().data
            if data:
                taken.append(data)
                self._queued -= len(data)
        self._resume_if_drained()
        return taken

    def _resume_if_drained(self) -> None:
        if self._paused and self._queued <= HIGH_WATER // 2 and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()

    async def receive(self) -> Piece | None:
        """The next piece received; None once no more will come."""
        while not self._pieces:
            if self.input_ended:
                return None
            self._readable = asyncio.get_running_loop().create_future()
            await self._readable
        piece = self._pieces.popleft()
        self._queued -= len(piece.data)
        self._resume_if_drained()
        return piece

    async def send(self, data: bytes, opcode: Opcode = Opcode.BINARY) -> None:
        """One message; waits while the client is slow. ConnectionResetError once closing."""
        self._check_open()
        self._write_framed(frame_header(opcode, len(data)), data)
        await self._drain()

    async def send_channel(self, channel: int, data: bytes) -> None:
        """One binary message: the channel byte, then `data`."""
        self._check_open()
        self._write_framed(frame_header(Opcode.BINARY, len(data) + 1) + bytes((channel,)), data)
        await self._drain()

    async def close(self, code: int = CloseCode.NORMAL, reason: str = "") -> None:
        """Send a close frame (once), wait for the client's within `CLOSE_TIMEOUT`, hang up.

        Never waits for the close frame to drain: a client that reads nothing
        gets no answer from us either, and is dropped when the wait ends.
        """
        if self._transport is None:
            return
        if not self._close_sent:
            self._drop_input()
        self._send_close(code, reason)
        if not (self._close_received or self._lost):
            self._closed_waiter = asyncio.get_running_loop().create_future()
            try:
                async with asyncio.timeout(CLOSE_TIMEOUT):
                    await self._closed_waiter
            except TimeoutError:
                log.debug("no close frame from the client within %gs", CLOSE_TIMEOUT)
                self.abort()
                return
        self._finish()

    def abort(self) -> None:
        """Drop the connection at once."""
        if self._transport is not None:
            self._transport.abort()

    def _send_close(self, code: int, reason: str) -> None:
        if self._close_sent:
            return
        self._close_sent = True
        if self.close_code is None:
            self.close_code = code
        payload = close_payload(code, reason)
        self._write(frame_header(Opcode.CLOSE, len(payload)) + payload)

    def _drop_input(self) -> None:
        """We closed first: what waits to be read will not be, and reading goes on only
        to see the client's close frame."""
        self._pieces.clear()
        self._queued = 0
        if self._paused and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()
        _wake(self._readable)

    def _check_open(self) -> None:
        if self._close_sent or self._lost or self._transport is None:
            raise ConnectionResetError("the WebSocket is closing")

    def _write_framed(self, header: bytes, data: bytes) -> None:
        """A header and its payload: joined when small, else one gathered write (no copy)."""
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if len(data) <= SMALL:
            transport.write(header + data)
        else:
            transport.writelines((header, data))

    def _write(self, data: bytes) -> None:
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.write(data)

    async def _drain(self) -> None:
        while self._write_paused and not self._lost:
            self._drained = asyncio.get_running_loop().create_future()
            await self._drained
        if self._lost:
            raise ConnectionResetError("the client connection is lost")

    # -- keepalive -------------------------------------------------------------------

    def _arm(self, delay: float) -> None:
        self._timer = asyncio.get_running_loop().call_later(delay, self._tick)

    def _tick(self) -> None:
        """Every interval: a peer heard from is fine; else ping it, and drop it if it was."""
        interval = self._ping_interval
        assert interval
        if self._heard:
            self._heard = self._pinged = False
            self._arm(interval)
        elif self._pinged:
            log.info("no answer to a WebSocket ping within %gs; dropping the client", interval / 2)
            self.close_code = self.close_code or CloseCode.ABNORMAL
            self.abort()
        elif not self._close_sent:
            self._pinged = True
            self._write(frame_header(Opcode.PING, 0))
            self._arm(interval / 2)


def _wake(waiter: asyncio.Future[None] | None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(None)
