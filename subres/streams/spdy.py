"""SPDY/3.1 sessions over a byte carrier: the I/O half of `subres.protocol.spdy`.

`SpdySession` drives a sans-I/O `SpdyConnection` over a carrier: the raw
upgraded socket (`streams.upgrade`) or a WebSocket carrying tunnelled SPDY
(`WebSocketCarrier`). Each stream the peer opens comes out of `accept()` as a
`SpdyStream`, a `ClientStream` the pump can join to a backend, with reply,
reset and half-close.

The Go peer (moby/spdystream) ignores flow-control windows, so backpressure is
all ours: writers wait while more than `SEND_HIGH_WATER` bytes are queued, and
the reader stops taking bytes from the carrier while that queue is high or a
stream holds `STREAM_BUFFER` unread bytes. Order rules learnt from that peer:
nothing is sent before its first frame (the codec queues nothing until then
and pings start after it), no HEADERS frames, and GOAWAY is the last frame.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from typing import Protocol

from aiohttp import WSMsgType, web

from subres.protocol.spdy import (
    ConnectionTerminated,
    DataReceived,
    Event,
    Headers,
    Limits,
    Role,
    RstStatus,
    SpdyConnection,
    SpdyError,
    StreamEnded,
    StreamOpened,
    StreamReset,
)
from subres.streams import upgrade
from subres.streams.websocket import CloseCode, binary_queued

__all__ = [
    "SEND_HIGH_WATER",
    "STREAM_BUFFER",
    "Carrier",
    "SpdySession",
    "SpdyStream",
    "WebSocketCarrier",
]

log = logging.getLogger(__name__)

SEND_HIGH_WATER = 256 * 1024
"""Bytes queued for the carrier before writers wait and the reader pauses."""
STREAM_BUFFER = 256 * 1024
"""Unread bytes one stream may hold before the reader pauses the whole carrier."""
WRITE_CHUNK = 256 * 1024
"""Most bytes handed to the carrier in one write (one WebSocket message when tunnelled)."""
FLUSH_TIMEOUT = 5.0
"""Seconds the last frames (resets, GOAWAY) may take to leave before the carrier is dropped."""


class Carrier(Protocol):
    """What SPDY bytes travel over."""

    async def read(self) -> bytes:
        """The next bytes from the peer; b"" once it is gone."""
        ...

    async def write(self, data: bytes) -> None:
        """Send `data`, waiting while the peer is slow."""
        ...

    async def close(self) -> None:
        """Let the peer see what was sent, then release the connection."""
        ...


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
            if parts and (size >= WRITE_CHUNK or not binary_queued(self.ws)):
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


class SpdyStream:
    """A stream the peer opened, seen as a `ClientStream`.

    `read` returns b"" once at the peer's half-close (FIN), then waits until the
    stream is gone: reset, closed by us, both sides finished, or the session ended.
    """

    def __init__(self, session: SpdySession, stream_id: int, headers: Headers) -> None:
        self.session = session
        self.stream_id = stream_id
        self.headers = headers
        # Received payloads as they came, joined only when read: one copy at most.
        self._chunks: list[bytes] = []
        self._size = 0
        self._readable = asyncio.Event()
        self._remote_ended = False
        self._eof_read = False
        self._local_ended = False
        self._dead = False

    def __repr__(self) -> str:
        return f"<SpdyStream {self.stream_id} {dict(self.headers)}>"

    def header(self, name: str) -> str:
        """The first value of header `name` (lowercase), or ""."""
        return next((value for key, value in self.headers if key == name), "")

    @property
    def gone(self) -> bool:
        """Nothing flows either way any more."""
        return self._dead or (self._remote_ended and self._local_ended)

    def reply(self) -> None:
        """Accept the stream: an empty SYN_REPLY."""
        if not self._dead:
            self.session._command(lambda conn: conn.reply(self.stream_id))

    def reset(self) -> None:
        """Refuse or abandon the stream: RST_STREAM (CANCEL)."""
        if not self._dead:
            self.session._command(lambda conn: conn.reset_stream(self.stream_id, RstStatus.CANCEL))
            self._end()

    async def read(self) -> bytes:
        """The bytes received since the last read; see the class docstring for b""."""
        while True:
            if self._chunks:
                chunks = self._chunks
                data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                self._chunks = []
                self._size = 0
                self.session._drained(self)
                return data
            if self.gone or (self._remote_ended and not self._eof_read):
                self._eof_read = True
                return b""
            self._readable.clear()
            await self._readable.wait()

    async def write(self, data: bytes) -> None:
        """Send `data` on the stream; raises ConnectionResetError once it cannot be sent."""
        await self.session._send(self, data)

    async def write_eof(self) -> None:
        """Half-close our side: an empty DATA frame with FIN."""
        if not self._dead and not self._local_ended:
            self._local_ended = True
            self.session._command(lambda conn: conn.end_stream(self.stream_id))
            self._wake()

    async def close(self) -> None:
        """We are done with the stream: half-close our side; what still arrives is dropped."""
        await self.write_eof()
        self._end()

    async def abort(self, reason: str) -> None:
        """Reset the stream because something failed."""
        log.info("resetting stream %d: %s", self.stream_id, reason)
        self.reset()

    # -- the session's side --------------------------------------------------

    def _received(self, data: bytes) -> None:
        self._chunks.append(data)
        self._size += len(data)
        self._wake()

    def _ended_by_peer(self) -> None:
        self._remote_ended = True
        self._wake()

    def _end(self) -> None:
        """Gone: no more input is kept and readers wake."""
        self._dead = True
        self._chunks = []
        self._size = 0
        self.session._forget(self)
        self._wake()

    def _wake(self) -> None:
        self._readable.set()

    @property
    def _buffered(self) -> int:
        return self._size


class SpdySession:
    """The server end of one SPDY/3.1 connection over `carrier`.

    Use as an async context manager: entering starts reading, leaving resets
    open streams, sends GOAWAY last and closes the carrier.
    """

    def __init__(
        self,
        carrier: Carrier,
        *,
        limits: Limits | None = None,
        ping_interval: float | None = None,
    ) -> None:
        self.carrier = carrier
        self._conn = SpdyConnection(Role.SERVER, limits)
        self._ping_interval = ping_interval
        self._streams: dict[int, SpdyStream] = {}
        self._full: set[int] = set()
        self._incoming: deque[SpdyStream] = deque()
        self._arrived = asyncio.Event()
        self._output = asyncio.Event()
        self._room = asyncio.Event()
        self._unblocked = asyncio.Event()
        self._ended = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None
        self._writer: asyncio.Task[None] | None = None
        self._pinger: asyncio.Task[None] | None = None
        self._last_heard: float | None = None
        self._peer_gone = False
        self._closing: asyncio.Task[None] | None = None

    async def __aenter__(self) -> SpdySession:
        self._reader = asyncio.create_task(self._read_loop())
        self._writer = asyncio.create_task(self._write_loop())
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    @property
    def ended(self) -> bool:
        """The session is over: no stream will come and none can send."""
        return self._ended.is_set()

    async def wait_ended(self) -> None:
        """Wait until the session is over."""
        await self._ended.wait()

    async def accept(self) -> SpdyStream | None:
        """The next stream the peer opened (reply or reset it), or None once the session ended."""
        while not self._incoming and not self.ended:
            self._arrived.clear()
            await self._arrived.wait()
        return None if self.ended else self._incoming.popleft()

    async def close(self, code: int = CloseCode.NORMAL, reason: str = "") -> None:
        """Reset open streams, send GOAWAY last, flush, close the carrier.

        Every caller waits for the one closing; a cancelled caller does not
        interrupt it. `code` is accepted for the session registry; SPDY has
        only GOAWAY.
        """
        if self._closing is None:
            if reason and not self.ended:
                log.info("closing SPDY session: %s", reason)
            self._closing = asyncio.create_task(self._close())
        await asyncio.shield(self._closing)

    async def _close(self) -> None:
        # The peer must speak first; a GOAWAY to a silent or vanished peer is pointless.
        self._end(goaway=not self._peer_gone and self._last_heard is not None)
        helpers = [t for t in (self._reader, self._pinger) if t is not None]
        for task in helpers:
            task.cancel()
        if helpers:
            # The reader must be out of the carrier before `close` reads it again.
            await asyncio.wait(helpers)
        if self._writer is not None:
            done, _ = await asyncio.wait([self._writer], timeout=FLUSH_TIMEOUT)
            if not done:
                self._writer.cancel()
                await asyncio.wait([self._writer])
        await self.carrier.close()

    # -- the end -----------------------------------------------------------------

    def _end(self, *, goaway: bool) -> None:
        if self.ended:
            return
        self._ended.set()
        for stream in list(self._streams.values()):
            stream._end()
        self._incoming.clear()
        for event in (self._arrived, self._room, self._unblocked, self._output):
            event.set()
        if goaway:
            # Resets, then GOAWAY: nothing is queued after it because no input
            # is fed to the codec and no command is issued from now on.
            self._conn.close()

    def _lost(self) -> None:
        """The carrier failed or reached EOF: there is no one to tell."""
        self._peer_gone = True
        self._end(goaway=False)

    # -- commands from streams ---------------------------------------------------

    def _command(self, command: Callable[[SpdyConnection], object]) -> None:
        if self.ended:
            return
        try:
            command(self._conn)
        except SpdyError as exc:
            log.debug("SPDY command refused: %s", exc)
        self._output.set()

    async def _send(self, stream: SpdyStream, data: bytes) -> None:
        while self._conn.bytes_to_send >= SEND_HIGH_WATER and not self.ended:
            self._room.clear()
            await self._room.wait()
        if stream.gone or stream._local_ended:
            raise ConnectionResetError(f"stream {stream.stream_id} is closed")
        try:
            self._conn.send_data(stream.stream_id, data)
        except SpdyError as exc:
            stream._end()
            raise ConnectionResetError(f"stream {stream.stream_id}: {exc}") from None
        self._output.set()

    def _drained(self, stream: SpdyStream) -> None:
        if stream.stream_id in self._full:
            self._full.discard(stream.stream_id)
            self._unblocked.set()

    def _forget(self, stream: SpdyStream) -> None:
        self._streams.pop(stream.stream_id, None)
        self._drained(stream)

    # -- the reader ---------------------------------------------------------------

    async def _read_loop(self) -> None:
        try:
            while not self.ended:
                await self._wait_readable()
                data = await self.carrier.read()
                if not data:
                    self._lost()
                    return
                self._heard()
                for event in self._conn.receive_data(data):
                    self._dispatch(event)
                if self._conn.bytes_to_send:
                    # Replies to the peer (pings, resets) wait: wake the writer only for them.
                    self._output.set()
        except (OSError, RuntimeError) as exc:
            log.debug("SPDY carrier read failed: %s", exc)
            self._lost()

    async def _wait_readable(self) -> None:
        while (self._full or self._conn.bytes_to_send >= SEND_HIGH_WATER) and not self.ended:
            self._unblocked.clear()
            await self._unblocked.wait()

    def _heard(self) -> None:
        if self._last_heard is None and self._ping_interval:
            # The peer spoke first: from now on we may ping it.
            self._pinger = asyncio.create_task(self._ping_loop(self._ping_interval))
        self._last_heard = asyncio.get_running_loop().time()

    def _dispatch(self, event: Event) -> None:
        match event:
            case StreamOpened(stream_id=sid, headers=headers):
                stream = SpdyStream(self, sid, headers)
                self._streams[sid] = stream
                self._incoming.append(stream)
                self._arrived.set()
            case DataReceived(stream_id=sid, data=data) if sid in self._streams:
                stream = self._streams[sid]
                stream._received(data)
                if stream._buffered >= STREAM_BUFFER:
                    self._full.add(sid)
            case StreamEnded(stream_id=sid) if sid in self._streams:
                self._streams[sid]._ended_by_peer()
            case StreamReset(stream_id=sid) if sid in self._streams:
                self._streams[sid]._end()
            case ConnectionTerminated(reason=reason):
                log.info("SPDY peer broke the protocol: %s", reason)
                # The codec queued the GOAWAY itself; it only needs flushing.
                self._end(goaway=False)

    # -- the writer and the pinger -----------------------------------------------

    async def _write_loop(self) -> None:
        try:
            while True:
                await self._output.wait()
                self._output.clear()
                while chunk := self._conn.data_to_send(WRITE_CHUNK):
                    self._room.set()
                    self._unblocked.set()
                    await self.carrier.write(chunk)
                if self.ended:
                    return
        except (OSError, RuntimeError) as exc:
            log.debug("SPDY carrier write failed: %s", exc)
            self._lost()

    async def _ping_loop(self, interval: float) -> None:
        loop = asyncio.get_running_loop()
        while not self.ended:
            await asyncio.sleep(interval)
            if self._last_heard is not None and loop.time() - self._last_heard > 3 * interval:
                log.info("SPDY peer silent for %.0fs; ending the session", 3 * interval)
                self._lost()
                return
            self._command(lambda conn: conn.ping())
