"""One asyncio SPDY/3.1 engine for both ends: the I/O half of `subres.protocol.spdy`.

`SpdySession` drives a sans-I/O `SpdyConnection` over a `Carrier` (an
upgraded socket, or a WebSocket carrying tunnelled SPDY; the server and the
CLI bring their own). Both ends run the same reader, writer, pinger and
shutdown; they differ only in how a stream starts: the server `accept`s the
streams the peer opened and replies to or resets each, the client
`open_stream`s and waits for the reply.

The Go peer (moby/spdystream) ignores flow-control windows, so backpressure is
all ours: writers wait while `SEND_HIGH_WATER` bytes are queued, and the
reader stops taking bytes from the carrier while a stream holds
`STREAM_BUFFER` unread bytes, or while the answers to the peer's own frames
(pings, resets) pile up past `OUTPUT_LIMIT` because it reads none of them.
Order rules learnt from that peer: a server sends nothing before the
client's first frame (the codec queues nothing until then, and a server pings
only after it), no HEADERS frames, and GOAWAY is the last frame.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Protocol

from subres.engine.stream import Chunk
from subres.protocol.spdy import (
    ConnectionTerminated,
    DataReceived,
    Event,
    GoAwayReceived,
    Headers,
    HeadersLike,
    Limits,
    Role,
    RstStatus,
    SpdyConnection,
    StreamEnded,
    StreamOpened,
    StreamReplied,
    StreamReset,
    StreamState,
)

__all__ = [
    "FLUSH_TIMEOUT",
    "OUTPUT_LIMIT",
    "SEND_HIGH_WATER",
    "STREAM_BUFFER",
    "WRITE_CHUNK",
    "Carrier",
    "SpdySession",
    "SpdyStream",
]

log = logging.getLogger(__name__)

SEND_HIGH_WATER = 1024 * 1024
"""Bytes queued for the carrier before writers wait."""
OUTPUT_LIMIT = 4 * SEND_HIGH_WATER
"""Bytes queued for the carrier before the reader pauses too.

Well above what writers queue (`SEND_HIGH_WATER` plus one write): pausing the
reader for data we send would deadlock a peer that echoes, which stops
reading while its own writes wait for us to read."""
STREAM_BUFFER = 1024 * 1024
"""Unread bytes one stream may hold before the reader pauses the whole carrier."""
WRITE_CHUNK = 256 * 1024
"""Most bytes handed to the carrier in one write (one WebSocket message when tunnelled)."""
FLUSH_TIMEOUT = 5.0
"""Seconds the last frames (resets, GOAWAY) may take to leave before the carrier is dropped."""
SILENT_PINGS = 3
"""Ping intervals without a byte from the peer (while we read) before it counts as gone."""


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


class SpdyStream:
    """One stream of a session, opened by either end; a `ClientStream` for the pump.

    Its state is the codec's (`SpdyConnection.stream_state`) while the session
    holds it; a stream the session let go (reset by either end, closed by us,
    or the session ended) is CLOSED. `read` returns b"" once at the peer's
    half-close (FIN), then waits until the stream is gone; after that it
    returns b"" at once.
    """

    def __init__(self, session: SpdySession, stream_id: int, headers: Headers = ()) -> None:
        self.session = session
        self.stream_id = stream_id
        self.headers = headers
        """The peer's SYN_STREAM headers; empty on a stream this end opened."""
        # Received payloads as they came (views of the carrier's reads), joined only
        # when read as bytes: `read_gathered` hands them on as they are.
        self._chunks: list[Chunk] = []
        self._size = 0
        self._changed = asyncio.Event()
        self._eof_read = False
        """`read` has returned the b"" of the peer's FIN (not codec state: ours)."""
        self.peer_replied = False
        """The peer's SYN_REPLY arrived: history, which the codec forgets with the stream
        (a reply and a reset can come in one read, before anyone waited)."""

    def __repr__(self) -> str:
        return f"<SpdyStream {self.stream_id} {dict(self.headers)}>"

    def header(self, name: str) -> str:
        """The first value of header `name` (lowercase), or ""."""
        return next((value for key, value in self.headers if key == name), "")

    @property
    def state(self) -> StreamState:
        """Where the stream is in its life (the codec's table while the session holds it)."""
        if not self._held:
            return StreamState.CLOSED
        return self.session._conn.stream_state(self.stream_id)

    @property
    def _held(self) -> bool:
        return self.session._streams.get(self.stream_id) is self

    @property
    def gone(self) -> bool:
        """Nothing flows either way any more."""
        return self.state is StreamState.CLOSED

    @property
    def _remote_ended(self) -> bool:
        return self.state in (StreamState.HALF_CLOSED_REMOTE, StreamState.CLOSED)

    @property
    def _local_ended(self) -> bool:
        return self.state in (StreamState.HALF_CLOSED_LOCAL, StreamState.CLOSED)

    def reply(self) -> None:
        """Accept a stream the peer opened: an empty SYN_REPLY (nothing once it is gone)."""
        if self._held:
            self.session._command(lambda conn: conn.reply(self.stream_id))

    async def wait_replied(self) -> None:
        """Wait for the peer's SYN_REPLY; ConnectionResetError when it refused the stream."""
        while not self.peer_replied:
            if self.gone:
                raise ConnectionResetError(f"the peer refused stream {self.stream_id}")
            await self._wait()

    def reset(self) -> None:
        """Refuse or abandon the stream: RST_STREAM (CANCEL), unless the codec closed it already."""
        if self._held:
            self.session._command(lambda conn: conn.reset_stream(self.stream_id, RstStatus.CANCEL))
            self._end()

    async def read(self) -> bytes:
        """The bytes received since the last read; see the class docstring for b""."""
        chunks = await self.read_gathered()
        return bytes(chunks[0]) if len(chunks) == 1 else b"".join(chunks)

    async def read_gathered(self) -> list[Chunk]:
        """What `read` returns, as the pieces it arrived in; [] for its b""."""
        while True:
            if self._chunks:
                chunks = self._chunks
                self._chunks = []
                self._size = 0
                self.session._drained(self)
                return chunks
            if self.gone or (self._remote_ended and not self._eof_read):
                self._eof_read = True
                return []
            await self._wait()

    async def write(self, data: bytes) -> None:
        """Send `data` on the stream; raises ConnectionResetError once it cannot be sent."""
        await self.session._send(self, data)

    async def write_eof(self) -> None:
        """Half-close our side: an empty DATA frame with FIN."""
        if not self._local_ended:
            self.session._command(lambda conn: conn.end_stream(self.stream_id))
            self._changed.set()

    async def close(self) -> None:
        """We are done with the stream: half-close our side; what still arrives is dropped."""
        await self.write_eof()
        if self._held:
            self._end()

    async def abort(self, reason: str) -> None:
        """Reset the stream because something failed."""
        log.info("resetting stream %d: %s", self.stream_id, reason)
        self.reset()

    async def _wait(self) -> None:
        self._changed.clear()
        await self._changed.wait()

    # -- the session's side --------------------------------------------------

    def _received(self, data: Chunk) -> None:
        self._chunks.append(data)
        self._size += len(data)
        self._changed.set()

    def _end(self) -> None:
        """Let go: no more input is kept and waiters wake."""
        self._chunks = []
        self._size = 0
        self.session._forget(self)
        self._changed.set()


class SpdySession:
    """One SPDY/3.1 connection over `carrier`, as `role`.

    `start` (or entering it as an async context manager) runs it; it then runs
    until `close` (leaving the context), a protocol error, the carrier's end,
    or a peer silent for `SILENT_PINGS` ping intervals. Whatever ends it, open
    streams end, the last frames (resets, GOAWAY last) are flushed within
    `FLUSH_TIMEOUT`, and the carrier is closed.
    """

    def __init__(
        self,
        carrier: Carrier,
        *,
        role: Role,
        limits: Limits | None = None,
        ping_interval: float | None = None,
    ) -> None:
        self.carrier = carrier
        self.role = role
        self._conn = SpdyConnection(role, limits)
        self._ping_interval = ping_interval
        self._streams: dict[int, SpdyStream] = {}
        self._full: set[int] = set()
        self._incoming: deque[SpdyStream] = deque()
        self._arrived = asyncio.Event()
        self._output = asyncio.Event()
        self._room = asyncio.Event()
        self._unblocked = asyncio.Event()
        self._ended = asyncio.Event()
        # A client speaks first; a server only once the peer has.
        self._last_heard: float | None = None
        self._peer_gone = False
        self._paused = False
        self._run_task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> SpdySession:
        self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    def start(self) -> None:
        """Start reading, writing and (for a client at once) pinging."""
        if self._run_task is None:
            self._run_task = asyncio.create_task(self._run())

    @property
    def ended(self) -> bool:
        """The session is over: no stream will come and none can send."""
        return self._ended.is_set()

    @property
    def usable(self) -> bool:
        """New streams may still be opened on it."""
        return not self.ended and not self._conn.goaway_received

    async def wait_ended(self) -> None:
        """Wait until the session is over."""
        await self._ended.wait()

    async def accept(self) -> SpdyStream | None:
        """The next stream the peer opened (reply or reset it), or None once the session ended."""
        while not self._incoming and not self.ended:
            self._arrived.clear()
            await self._arrived.wait()
        return None if self.ended else self._incoming.popleft()

    def open_stream(self, headers: HeadersLike) -> SpdyStream:
        """Queue a SYN_STREAM; raises `SpdyError` when the session takes no new stream."""
        stream = SpdyStream(self, self._conn.open_stream(headers))
        self._streams[stream.stream_id] = stream
        self._output.set()
        return stream

    async def close(self, code: int = 1000, reason: str = "") -> None:
        """End the session (resets, GOAWAY last) and wait until its carrier is closed.

        Every caller waits for the one closing; a cancelled caller does not
        interrupt it. `code` is accepted for the session registry; SPDY has
        only GOAWAY.
        """
        if reason and not self.ended:
            log.info("closing SPDY session: %s", reason)
        self._end(goaway=self._may_speak and not self._peer_gone)
        if self._run_task is not None:
            await asyncio.shield(self._run_task)

    @property
    def _may_speak(self) -> bool:
        return self.role is Role.CLIENT or self._last_heard is not None

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

    async def _run(self) -> None:
        reader = asyncio.create_task(self._read_loop())
        writer = asyncio.create_task(self._write_loop())
        pinger = asyncio.create_task(self._ping_loop())
        try:
            await self._ended.wait()
        finally:
            self._end(goaway=False)
            for task in (reader, pinger):
                task.cancel()
            # The reader must be out of the carrier before `close` reads it again.
            await asyncio.wait([reader, pinger])
            # The writer leaves once the queue (resets, GOAWAY last) is out.
            if not (await asyncio.wait([writer], timeout=FLUSH_TIMEOUT))[0]:
                writer.cancel()
                await asyncio.wait([writer])
            await self.carrier.close()

    # -- commands from streams ---------------------------------------------------

    def _command(self, command: Callable[[SpdyConnection], object]) -> None:
        """Run a codec command; its `SpdyError` is a bug of ours and raises.

        Streams the peer reset are let go in the same step as the codec
        forgets them, so no command reaches a stream closed under it.
        """
        if self.ended:
            return
        command(self._conn)
        self._output.set()

    async def _send(self, stream: SpdyStream, data: bytes) -> None:
        while self._conn.bytes_to_send >= SEND_HIGH_WATER and not self.ended:
            self._room.clear()
            await self._room.wait()
        # The one failure tolerated: the peer reset the stream (or the session
        # ended) while this write waited for room.
        if stream._local_ended:
            raise ConnectionResetError(f"stream {stream.stream_id} is closed")
        self._conn.send_data(stream.stream_id, data)
        self._output.set()

    def _drained(self, stream: SpdyStream) -> None:
        if stream.stream_id in self._full:
            self._full.discard(stream.stream_id)
            self._unblocked.set()

    def _forget(self, stream: SpdyStream) -> None:
        self._streams.pop(stream.stream_id, None)
        self._drained(stream)
        self._end_if_done()

    def _end_if_done(self) -> None:
        # After the peer's GOAWAY it waits for us to hang up once our streams are over.
        if self._conn.goaway_received and not self._streams and not self.ended:
            self._end(goaway=False)

    # -- the reader ---------------------------------------------------------------

    async def _read_loop(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while not self.ended:
                await self._wait_readable()
                data = await self.carrier.read()
                if not data:
                    self._lost()
                    return
                self._last_heard = loop.time()
                for event in self._conn.receive_data(data):
                    self._dispatch(event)
                if self._conn.bytes_to_send:
                    # Answers to the peer (pings, resets) wait: wake the writer only for them.
                    self._output.set()
        except (OSError, RuntimeError) as exc:
            log.debug("SPDY carrier read failed: %s", exc)
            self._lost()

    async def _wait_readable(self) -> None:
        if not self._full and self._conn.bytes_to_send < OUTPUT_LIMIT:
            return
        self._paused = True
        try:
            while (self._full or self._conn.bytes_to_send >= OUTPUT_LIMIT) and not self.ended:
                self._unblocked.clear()
                await self._unblocked.wait()
        finally:
            self._paused = False
            if self._last_heard is not None:
                # Our own pause is not the peer's silence.
                self._last_heard = asyncio.get_running_loop().time()

    def _dispatch(self, event: Event) -> None:
        match event:
            case StreamOpened(stream_id=sid, headers=headers):
                self._opened_by_peer(sid, headers)
            case StreamReplied(stream_id=sid) if sid in self._streams:
                self._streams[sid].peer_replied = True
                self._streams[sid]._changed.set()
            case StreamEnded(stream_id=sid) if sid in self._streams:
                self._streams[sid]._changed.set()
            case DataReceived(stream_id=sid, data=data) if sid in self._streams:
                stream = self._streams[sid]
                stream._received(data)
                if stream._size >= STREAM_BUFFER:
                    self._full.add(sid)
            case StreamReset(stream_id=sid) if sid in self._streams:
                self._streams[sid]._end()
            case GoAwayReceived():
                self._end_if_done()  # else `usable` is False and the streams finish first
            case ConnectionTerminated(reason=reason):
                log.info("SPDY peer broke the protocol: %s", reason)
                # The codec queued the GOAWAY itself; it only needs flushing.
                self._end(goaway=False)

    def _opened_by_peer(self, stream_id: int, headers: Headers) -> None:
        stream = SpdyStream(self, stream_id, headers)
        self._streams[stream_id] = stream
        if self.role is Role.CLIENT:
            stream.reset()  # nothing here serves streams a server pushes
            return
        self._incoming.append(stream)
        self._arrived.set()

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

    async def _ping_loop(self) -> None:
        interval = self._ping_interval
        if not interval:
            return
        loop = asyncio.get_running_loop()
        if self.role is Role.CLIENT:
            self._last_heard = loop.time()
        while not self.ended:
            await asyncio.sleep(interval)
            heard = self._last_heard
            if heard is None:
                continue  # a server waits for the peer's first frame
            if not self._paused and loop.time() - heard > SILENT_PINGS * interval:
                log.info("SPDY peer silent for %.0fs; ending the session", SILENT_PINGS * interval)
                self._lost()
                return
            self._command(lambda conn: conn.ping())
