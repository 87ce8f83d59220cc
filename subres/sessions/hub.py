"""One console shared by a writer and any number of observers.

A console's output comes from one source at a time: the writer's own backend
connection, read through a `Tee`, or a kept connection whose reader calls
`Hub.deliver`. Each observer reads a `Feed`: the output since it attached,
queued up to a bound and handed out a few milliseconds later, after the
writer's copy and in one piece (`OBSERVER_DELAY`). An observer that falls
further behind than its bound is cut off and told why, so that it can
neither slow the writer nor grow the server's memory. What an observer sends
is dropped. Besides observers, a hub hands every chunk and resize to its
`Sink`s (a recording, `log` followers) and keeps a bounded
`Scrollback` when the console is kept. A kept console's writer reads its own
feed, which holds the kept connection back while the writer is slow, and
writes through a `KeptPort`.

The pump joins each client to a `ByteStream`; a `Tee` and a `Feed` are byte
streams, so observers and writers run through the same pump in every dialect.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from typing import Protocol

from subres.engine.stream import ByteStream
from subres.engine.websocket import CloseCode
from subres.protocol.channels import TerminalSize
from subres.sessions.scrollback import Scrollback

__all__ = [
    "FEED_LIMIT",
    "OBSERVER_DELAY",
    "Closer",
    "Feed",
    "Hub",
    "Kept",
    "KeptPort",
    "Sink",
    "Tee",
    "amount",
]

log = logging.getLogger(__name__)

FEED_LIMIT = 1 << 20
"""Bytes an observer may fall behind the console before it is cut off."""
OBSERVER_DELAY = 0.005
"""Seconds observers' output waits, so that it leaves after the writer's and in fewer frames."""


class Sink(Protocol):
    """Something that takes a console's output as it happens (a recording)."""

    def output(self, data: bytes) -> None:
        """Output the console produced."""

    def resized(self, size: TerminalSize) -> None:
        """The writer's terminal changed size."""

    def marker(self, text: str) -> None:
        """Something happened worth a note: who attached, who took over."""

    def let_go(self) -> None:
        """The console is no longer kept (its log followers end)."""


class Kept(Protocol):
    """The keeper of a console: its connection while it has one."""

    @property
    def backend(self) -> ByteStream | None:
        """The kept connection, or None while it is being dialed again."""

    @property
    def status(self) -> str:
        """Why there is no connection, in words."""


Closer = Callable[[int, str], None]
"""Ends one attached client's session with a close code and the reason in words."""


class Feed:
    """What one attached client reads: the console's output in order, b"" when it ends.

    Observers' feeds are filled without waiting (`offer`); a feed past its
    limit is cut, and its client closed through `closer`. A kept console's
    writer is fed with `put`, which waits for room: that writer holds the
    console back as a writer on its own connection would.
    """

    __slots__ = (
        "_chunks",
        "_closed",
        "_closer",
        "_code",
        "_cut",
        "_ended",
        "_hub",
        "_limit",
        "_readable",
        "_room",
        "_size",
    )

    def __init__(self, hub: Hub, *, limit: int) -> None:
        self._hub = hub
        self._limit = limit
        self._closed: Callable[[], None] | None = None
        self._chunks: collections.deque[bytes] = collections.deque()
        self._size = 0
        self._ended = False
        self._cut = ""
        self._code: int = CloseCode.FELL_BEHIND
        self._closer: Closer | None = None
        self._readable: asyncio.Future[None] | None = None
        self._room: asyncio.Future[None] | None = None

    @property
    def queued(self) -> int:
        """Bytes waiting for the client."""
        return self._size

    def attached(self, closer: Closer) -> None:
        """The session this feed serves is live; `closer` ends it."""
        self._closer = closer
        if self._cut:
            closer(self._code, self._cut)

    def announce(self, text: bytes) -> None:
        """Put `text` before everything queued (a banner for this client alone)."""
        self._chunks.appendleft(text)
        self._size += len(text)
        _wake(self._readable)

    def offer(self, chunk: bytes, *, wake: bool = True) -> None:
        """Queue `chunk` without waiting; past the limit, cut the feed off instead.

        With `wake` False the reader is not woken: the hub wakes every
        observer together a moment later (`Hub.publish`).
        """
        if self._ended:
            return
        if self._chunks and self._size + len(chunk) > self._limit:
            self.cut(f"fell more than {amount(self._limit)} behind the console")
            return
        self._chunks.append(chunk)
        self._size += len(chunk)
        if wake:
            _wake(self._readable)

    def wake(self) -> None:
        """Let the reader take what is queued."""
        if self._chunks:
            _wake(self._readable)

    async def put(self, chunk: bytes) -> None:
        """Queue `chunk`, first waiting while the feed is full."""
        while self._size >= self._limit and not self._ended:
            self._room = asyncio.get_running_loop().create_future()
            await self._room
        if not self._ended:
            self._append(chunk)

    def _append(self, chunk: bytes) -> None:
        self._chunks.append(chunk)
        self._size += len(chunk)
        _wake(self._readable)

    def end(self) -> None:
        """The console's output ended: the client reads what is queued, then b""."""
        self._ended = True
        _wake(self._readable)
        _wake(self._room)

    def cut(self, reason: str, code: int = CloseCode.FELL_BEHIND) -> None:
        """Stop feeding this client and end its session with `code` and `reason`."""
        if self._cut:
            return
        self._cut = reason
        self._code = code
        self._chunks.clear()
        self._size = 0
        self._ended = True
        _wake(self._room)
        if self._closer is not None:
            self._closer(code, reason)

    async def read(self) -> bytes:
        """Everything queued, as one chunk; b"" once the console ended.

        A feed that was cut never returns: its session is being closed, and
        the pump stops reading when the client is gone.
        """
        while not self._chunks:
            if self._ended and not self._cut:
                return b""
            self._readable = asyncio.get_running_loop().create_future()
            await self._readable
        chunk = self._chunks.popleft() if len(self._chunks) == 1 else b"".join(self._chunks)
        self._chunks.clear()
        self._size = 0
        _wake(self._room)
        return chunk

    async def write(self, data: bytes) -> None:
        """Input from a client that may not type: dropped."""

    async def write_eof(self) -> None:
        """The client's input ended: nothing to tell anyone."""

    def closed_by(self, callback: Callable[[], None]) -> None:
        """Call `callback` once this feed is closed (an observer's place goes back)."""
        self._closed = callback

    async def close(self) -> None:
        """Detach from the console."""
        self.end()
        self._hub.detach(self)
        if self._closed is not None:
            callback, self._closed = self._closed, None
            callback()


class Tee:
    """The writer's own backend connection, its output also published to the console's hub.

    The newest writer's tee is the hub's source: during a takeover the
    writer being replaced still reads its backend until it closes, but only
    the newcomer's output reaches the observers. Resizes and the exit status
    pass through to the backend when it has them (`backends.stream.Terminal`).
    """

    __slots__ = ("_backend", "_banner", "_hub", "_started")

    def __init__(self, backend: ByteStream, hub: Hub) -> None:
        self._backend = backend
        self._hub = hub
        self._started = False
        self._banner = b""

    def announce(self, text: bytes) -> None:
        """Hand `text` to this writer before the backend's output."""
        self._banner = text

    @property
    def exit_code(self) -> int | None:
        """The backend's exit status, when it has one."""
        code = getattr(self._backend, "exit_code", None)
        return code if isinstance(code, int) else None

    @property
    def notice(self) -> str:
        """What opening the backend did that an audit should know (see `Record.backend`)."""
        notice = getattr(self._backend, "notice", "")
        return notice if isinstance(notice, str) else ""

    def resize(self, size: TerminalSize) -> None:
        """Pass a window size on to a backend that takes one; the hub records it."""
        resize = getattr(self._backend, "resize", None)
        if callable(resize):
            resize(size)
        if self._hub.source is self:
            self._hub.resized(size)

    async def read(self) -> bytes:
        """The backend's next chunk; observers get it too while this is the newest writer."""
        if not self._started:
            # The pump reads only once the session is registered, after any takeover.
            self._started = True
            self._hub.source = self
        if self._banner:
            banner, self._banner = self._banner, b""
            return banner
        chunk = await self._backend.read()
        if self._hub.source is self:
            if chunk:
                self._hub.publish(chunk)
            else:
                self._hub.end()
        return chunk

    async def write(self, data: bytes) -> None:
        """To the backend."""
        await self._backend.write(data)

    async def write_eof(self) -> None:
        """Half-close the backend."""
        await self._backend.write_eof()

    async def close(self) -> None:
        """Stop being the source, then close the backend."""
        self._hub.release(self)
        await self._backend.close()


class KeptPort:
    """A kept console as its writer's backend: output from the writer's feed, input to the keeper.

    The writer's feed replaces the previous writer's once the session is
    live (after the takeover), so a writer whose upgrade fails takes nothing
    from the one it would have replaced. The writer's end of input (a v5
    stdin close) reaches the kept connection too: the writer meant it, and
    the keeper dials again once the console ends. The connection itself is
    closed only by the keeper.
    """

    __slots__ = ("_feed", "_hub", "_keeper", "_tail")

    def __init__(self, hub: Hub, keeper: Kept, *, tail: int | None) -> None:
        self._hub = hub
        self._keeper = keeper
        self._tail = tail
        self._feed: Feed | None = None

    def _writer_feed(self) -> Feed:
        if self._feed is None:
            self._feed = self._hub.attach_writer(tail=self._tail)
        return self._feed

    def _backend(self) -> ByteStream:
        backend = self._keeper.backend
        if backend is None:
            raise ConnectionResetError("the kept console connection is being dialed again")
        return backend

    @property
    def exit_code(self) -> int | None:
        """The kept connection's exit status, when it has one."""
        code = getattr(self._keeper.backend, "exit_code", None)
        return code if isinstance(code, int) else None

    def resize(self, size: TerminalSize) -> None:
        """Pass a window size on to a kept connection that takes one; the hub records it."""
        resize = getattr(self._keeper.backend, "resize", None)
        if callable(resize):
            resize(size)
        if self._feed is not None and self._hub.writer is self._feed:
            self._hub.resized(size)

    def attached(self, closer: Closer) -> None:
        """The writer's session is live: it becomes the console's writer."""
        self._writer_feed().attached(closer)

    def announce(self, text: bytes) -> None:
        """Hand `text` to this writer before the console's output."""
        self._writer_feed().announce(text)

    async def read(self) -> bytes:
        """The console's next output, for this writer."""
        return await self._writer_feed().read()

    async def write(self, data: bytes) -> None:
        """To the kept connection."""
        await self._backend().write(data)

    async def write_eof(self) -> None:
        """Half-close the kept connection."""
        await self._backend().write_eof()

    async def close(self) -> None:
        """Detach; the kept connection stays."""
        if self._feed is not None:
            await self._feed.close()


class Hub:
    """The observers, sinks and scrollback of one console.

    `on_idle` is called when the hub has nothing left to serve (no source,
    no feed, not kept), so that its registry can forget it.
    """

    def __init__(
        self,
        *,
        on_idle: Callable[[Hub], None],
        scrollback: Scrollback | None = None,
        feed_limit: int = FEED_LIMIT,
    ) -> None:
        self.source: object | None = None
        """Whatever currently produces the output (a `Tee`, a keeper); None between writers."""
        self.keeper: Kept | None = None
        """Who keeps this console's connection open, when somebody does."""
        self.writer: Feed | None = None
        """A kept console's writer's feed."""
        self.feeds: set[Feed] = set()
        self.sinks: list[Sink] = []
        self.scrollback = scrollback
        self.size: TerminalSize | None = None
        """The writer's last window size."""
        self.notes: list[str] = []
        """What happened to the console while nobody recorded it, for its next recording."""
        self._feed_limit = feed_limit
        self._on_idle = on_idle
        self._waking: asyncio.TimerHandle | None = None

    @property
    def idle(self) -> bool:
        """Nothing to serve: no source, no feed, not kept."""
        return (
            self.source is None
            and self.keeper is None
            and self.writer is None
            and not self.feeds
            and not self.sinks
        )

    def keep(self, keeper: Kept, scrollback: Scrollback) -> None:
        """From now on `keeper` holds the connection and the output is kept."""
        self.keeper = keeper
        self.scrollback = scrollback

    def unkeep(self, keeper: Kept) -> None:
        """`keeper` no longer keeps the connection."""
        if self.keeper is keeper:
            self.keeper = None
            self.scrollback = None
            for sink in list(self.sinks):
                sink.let_go()
            self._check_idle()

    def add_sink(self, sink: Sink) -> None:
        """`sink` takes the output from now on."""
        self.sinks.append(sink)

    def remove_sink(self, sink: Sink) -> None:
        """`sink` is done."""
        self.sinks.remove(sink)
        self._check_idle()

    def attach(self, *, tail: int | None = None) -> Feed:
        """A new observer's feed, starting with the scrollback (its last `tail` lines)."""
        feed = self._feed(tail)
        self.feeds.add(feed)
        return feed

    def attach_writer(self, *, tail: int | None = None) -> Feed:
        """A kept console's new writer's feed (a previous writer is being taken over)."""
        self.writer = self._feed(tail)
        return self.writer

    def _feed(self, tail: int | None) -> Feed:
        feed = Feed(self, limit=self._feed_limit)
        if self.scrollback is not None:
            replay = self.scrollback.tail(tail)
            if replay:
                feed.offer(replay)
        return feed

    def detach(self, feed: Feed) -> None:
        """A client left."""
        self.feeds.discard(feed)
        if self.writer is feed:
            self.writer = None
        self._check_idle()

    def release(self, source: object) -> None:
        """`source` stopped producing output (its writer left)."""
        if self.source is source:
            self.source = None
        self._check_idle()

    def publish(self, chunk: bytes) -> None:
        """New output: to the scrollback, the sinks and every feed.

        Observers are woken together `OBSERVER_DELAY` later, not at once: the
        writer's output leaves first, and while output flows each observer is
        sent one larger frame per delay rather than one per chunk.
        """
        if self.scrollback is not None:
            self.scrollback.append(chunk)
        for sink in self.sinks:
            sink.output(chunk)
        if not self.feeds:
            return
        for feed in list(self.feeds):
            feed.offer(chunk, wake=False)
        if self._waking is None:
            self._waking = asyncio.get_running_loop().call_later(OBSERVER_DELAY, self._wake)

    def _wake(self) -> None:
        self._waking = None
        for feed in self.feeds:
            feed.wake()

    async def deliver(self, chunk: bytes) -> None:
        """A kept connection's output: published, then queued for the writer (who may wait)."""
        self.publish(chunk)
        writer = self.writer
        if writer is not None:
            await writer.put(chunk)

    def resized(self, size: TerminalSize) -> None:
        """The writer's window changed size."""
        self.size = size
        for sink in self.sinks:
            sink.resized(size)

    def marker(self, text: str) -> None:
        """Note an event in the sinks (a recording's markers)."""
        for sink in self.sinks:
            sink.marker(text)

    def end(self) -> None:
        """The console's output ended (its backend closed): every feed ends."""
        for feed in self._attached():
            feed.end()

    def cut(self, reason: str, code: int) -> None:
        """The console's connection was lost: every client is closed with `code`, `reason`."""
        for feed in self._attached():
            feed.cut(reason, code)

    def _attached(self) -> list[Feed]:
        return [*self.feeds, *([self.writer] if self.writer else [])]

    def _check_idle(self) -> None:
        if self.idle:
            self._on_idle(self)


def amount(size: int) -> str:
    """`size` bytes in a reason's words: `1024 KiB`, or `10 bytes`."""
    return f"{size // 1024} KiB" if size % 1024 == 0 else f"{size} bytes"


def _wake(future: asyncio.Future[None] | None) -> None:
    if future is not None and not future.done():
        future.set_result(None)
