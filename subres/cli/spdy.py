"""A lean asyncio client of SPDY/3.1 over one byte carrier, for `port-forward`.

Drives the sans-I/O `subres.protocol.spdy` codec in the client role over
either carrier Kubernetes offers: a raw HTTP/1.1 upgrade (`upgrade`) or a
WebSocket carrying the byte stream in binary messages (`tunnel`). Both open
the connection, send the request and read the `101` themselves, so no HTTP
library buffers the first frames and an error answer's Status body is kept.
`SpdyClient` opens streams, pings, and ends every stream when the carrier
fails or the peer stays silent.

As client-go does, this side speaks first (its first SYN_STREAM), sends no
HEADERS frames, and applies its own backpressure because the Go peer ignores
SPDY windows: writers wait while `SEND_HIGH_WATER` bytes are queued, and the
reader stops taking bytes while a stream holds `STREAM_BUFFER` unread ones.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import os
import ssl
from collections.abc import Callable, Mapping
from typing import Protocol
from urllib.parse import urlsplit

from websockets.frames import CloseCode, Frame, Opcode
from websockets.protocol import Protocol as WebSocketProtocol
from websockets.protocol import Side
from websockets.protocol import State as WebSocketState

from subres.protocol import httpstream
from subres.protocol.spdy import (
    ConnectionTerminated,
    DataReceived,
    Event,
    GoAwayReceived,
    HeadersLike,
    Role,
    SpdyConnection,
    SpdyError,
    StreamEnded,
    StreamReplied,
    StreamReset,
)

__all__ = [
    "Carrier",
    "ClientStream",
    "SocketCarrier",
    "SpdyClient",
    "UpgradeRefused",
    "WebSocketCarrier",
    "tunnel",
    "upgrade",
]

READ_SIZE = 256 * 1024
WRITE_CHUNK = 256 * 1024
"""Most bytes handed to the carrier at once (one WebSocket message when tunnelled)."""
SEND_HIGH_WATER = 1024 * 1024
STREAM_BUFFER = 1024 * 1024
PING_INTERVAL = 5.0
"""client-go's ping period; three silent periods end the session."""
FLUSH_TIMEOUT = 5.0
"""Seconds the last frames (resets, GOAWAY) may take to leave at the end."""
MAX_HEAD = 64 * 1024
MAX_BODY = 64 * 1024
MAX_MESSAGE = 16 * 1024 * 1024
"""Largest WebSocket message taken from the server (it sends at most 256 KiB)."""
_WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
_DATA_OPCODES = (Opcode.BINARY, Opcode.CONT)  # text is not SPDY: dropped


class Carrier(Protocol):
    """What SPDY bytes travel over."""

    async def read(self) -> bytes:
        """The next bytes from the peer; b"" once it is gone."""
        ...

    async def write(self, data: bytes) -> None:
        """Send `data`, waiting while the peer is slow."""
        ...

    async def close(self) -> None:
        """Release the connection."""
        ...


class SocketCarrier:
    """The upgraded connection itself."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    async def read(self) -> bytes:
        return await self._reader.read(READ_SIZE)

    async def write(self, data: bytes) -> None:
        self._writer.write(data)
        await self._writer.drain()

    async def close(self) -> None:
        self._writer.close()
        # A TLS peer that never answers our close_notify must not hold us up.
        with contextlib.suppress(OSError, TimeoutError):
            async with asyncio.timeout(FLUSH_TIMEOUT):
                await self._writer.wait_closed()


class WebSocketCarrier:
    """SPDY tunnelled in binary WebSocket messages (`SPDY/3.1+portforward.k8s.io`).

    websockets' sans-I/O framing over the upgraded connection: its clients
    refuse that subprotocol, which is not an RFC 7230 token. Message
    boundaries mean nothing; a close (or EOF) is the end.
    """

    def __init__(self, socket: SocketCarrier) -> None:
        self._socket = socket
        self._ws = WebSocketProtocol(Side.CLIENT, state=WebSocketState.OPEN, max_size=MAX_MESSAGE)

    async def read(self) -> bytes:
        while True:
            frames = self._ws.events_received()
            await self._flush()  # pongs, the answer to a close
            data = b"".join(
                f.data for f in frames if isinstance(f, Frame) and f.opcode in _DATA_OPCODES
            )
            if data or self._ws.state is not WebSocketState.OPEN:
                return data
            if chunk := await self._socket.read():
                self._ws.receive_data(chunk)
            else:
                self._ws.receive_eof()

    async def write(self, data: bytes) -> None:
        if self._ws.state is not WebSocketState.OPEN:
            raise ConnectionResetError("the WebSocket is closed")
        self._ws.send_binary(data)
        await self._flush()

    async def close(self) -> None:
        if self._ws.state is WebSocketState.OPEN:
            self._ws.send_close(CloseCode.NORMAL_CLOSURE)
        # The server answers our close and hangs up; closing first could cost it a reset.
        with contextlib.suppress(OSError, TimeoutError):
            async with asyncio.timeout(FLUSH_TIMEOUT):
                await self._flush()
                while await self._socket.read():
                    pass
        await self._socket.close()

    async def _flush(self) -> None:
        # One write of everything queued: the reader (pongs) and the writer both
        # flush, and frames taken by one must not pass those taken by the other.
        # An empty item asks for EOF, which closing the socket gives.
        if data := b"".join(self._ws.data_to_send()):
            await self._socket.write(data)


class UpgradeRefused(Exception):
    """The server answered the upgrade with `status` and `body` instead of `101`."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"the server answered {status}")
        self.status = status
        self.body = body


async def upgrade(
    url: str,
    *,
    protocol: str,
    headers: Mapping[str, str],
    tls: ssl.SSLContext | None,
    server_hostname: str | None,
) -> SocketCarrier:
    """POST a SPDY/3.1 upgrade offering `protocol` to `url`; the connection after the `101`.

    Raises `UpgradeRefused` for any other answer, OSError when unreachable.
    """
    request = {
        "Connection": "Upgrade",
        "Upgrade": httpstream.SPDY_UPGRADE,
        httpstream.VERSION_HEADER: protocol,
        "Content-Length": "0",
    }
    socket, answer = await _upgrade(
        "POST", url, {**request, **headers}, tls=tls, server_hostname=server_hostname
    )
    if answer.get(httpstream.VERSION_HEADER.lower()) != protocol:
        await socket.close()
        raise UpgradeRefused(101, b"the server chose no stream protocol we offered")
    return socket


async def tunnel(
    url: str,
    *,
    subprotocol: str,
    headers: Mapping[str, str],
    tls: ssl.SSLContext | None,
    server_hostname: str | None,
) -> WebSocketCarrier:
    """A WebSocket to `url` speaking `subprotocol`, as a carrier; errors as for `upgrade`."""
    key = base64.b64encode(os.urandom(16)).decode()
    request = {
        "Connection": "Upgrade",
        "Upgrade": "websocket",
        "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": key,
        "Sec-WebSocket-Protocol": subprotocol,
    }
    socket, answer = await _upgrade(
        "GET", url, {**request, **headers}, tls=tls, server_hostname=server_hostname
    )
    accept = base64.b64encode(hashlib.sha1((key + _WS_GUID).encode()).digest()).decode()
    if answer.get("sec-websocket-accept") != accept:
        await socket.close()
        raise UpgradeRefused(101, b"the server's Sec-WebSocket-Accept is wrong")
    if answer.get("sec-websocket-protocol") != subprotocol:
        await socket.close()
        raise UpgradeRefused(101, f"the server does not speak {subprotocol}".encode())
    return WebSocketCarrier(socket)


async def _upgrade(
    method: str,
    url: str,
    headers: Mapping[str, str],
    *,
    tls: ssl.SSLContext | None,
    server_hostname: str | None,
) -> tuple[SocketCarrier, dict[str, str]]:
    """Send an upgrade request; the connection after a `101` and the answer's headers."""
    parts = urlsplit(url)
    secure = parts.scheme == "https"
    reader, writer = await asyncio.open_connection(
        parts.hostname,
        parts.port or (443 if secure else 80),
        ssl=tls if secure else None,
        server_hostname=server_hostname if secure and server_hostname else None,
        limit=MAX_HEAD,
    )
    socket = SocketCarrier(reader, writer)
    try:
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        lines = [f"{method} {target} HTTP/1.1", f"Host: {parts.netloc}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        await socket.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        status, answer = _parse_head(await _head(reader))
        if status != 101:
            raise UpgradeRefused(status, await _body(reader, answer))
    except BaseException:
        await socket.close()
        raise
    return socket, answer


async def _head(reader: asyncio.StreamReader) -> bytes:
    try:
        return await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        raise ConnectionError("the server closed the connection during the upgrade") from None
    except asyncio.LimitOverrunError:
        raise ConnectionError("the server's answer has too long a head") from None


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    """The status code and the (lowercased, last-wins) headers of a response head."""
    status_line, *lines = head.decode("latin-1").split("\r\n")
    version, _, rest = status_line.partition(" ")
    code = rest[:3]
    if not version.startswith("HTTP/") or not code.isdigit():
        raise ConnectionError(f"not an HTTP answer: {status_line[:80]!r}")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(code), headers


async def _body(reader: asyncio.StreamReader, headers: Mapping[str, str]) -> bytes:
    """Up to `MAX_BODY` bytes of an error answer's body (it holds the Status)."""
    length = headers.get("content-length", "")
    with contextlib.suppress(OSError, asyncio.IncompleteReadError):
        if length.isdigit():
            return await reader.readexactly(min(int(length), MAX_BODY))
        return await reader.read(MAX_BODY)
    return b""


class ClientStream:
    """A stream this side opened.

    `read` returns b"" at the peer's FIN, at a reset, or when the session is over.
    """

    def __init__(self, client: SpdyClient, stream_id: int) -> None:
        self.client = client
        self.stream_id = stream_id
        self._chunks: list[bytes] = []
        self._size = 0
        self._changed = asyncio.Event()
        self._replied = False
        self._remote_ended = False
        self._local_ended = False
        self.dead = False

    async def wait_replied(self) -> None:
        """Wait for the peer's SYN_REPLY; ConnectionResetError when it refused the stream."""
        while not self._replied:
            if self.dead:
                raise ConnectionResetError(f"the server refused stream {self.stream_id}")
            await self._wait()

    async def read(self) -> bytes:
        """The bytes received since the last read; b"" once nothing more will come."""
        while not self._chunks:
            if self._remote_ended or self.dead:
                return b""
            await self._wait()
        data = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
        self._chunks = []
        self._size = 0
        self.client._consumed(self)
        return data

    async def write(self, data: bytes) -> None:
        """Send `data`; ConnectionResetError once the stream cannot carry it."""
        await self.client._send(self, data)

    def end(self) -> None:
        """Half-close: an empty DATA frame with FIN."""
        if not self.dead and not self._local_ended:
            self._local_ended = True
            self.client._command(lambda conn: conn.end_stream(self.stream_id))

    def reset(self) -> None:
        """Abandon the stream (RST_STREAM CANCEL when it is still open)."""
        if not self.dead:
            self.client._command(lambda conn: conn.reset_stream(self.stream_id))
            self._kill()

    async def _wait(self) -> None:
        self._changed.clear()
        await self._changed.wait()

    def _on_reply(self) -> None:
        self._replied = True
        self._changed.set()

    def _on_fin(self) -> None:
        self._remote_ended = True
        self._changed.set()

    def _received(self, data: bytes) -> None:
        self._chunks.append(data)
        self._size += len(data)
        self._changed.set()

    def _kill(self) -> None:
        self.dead = True
        self._chunks = []
        self._size = 0
        self.client._consumed(self)
        self._changed.set()


class SpdyClient:
    """The client end of one SPDY/3.1 connection over `carrier`; it runs until `close`
    or until the carrier fails, and then closes the carrier itself."""

    def __init__(self, carrier: Carrier, *, ping_interval: float = PING_INTERVAL) -> None:
        self._carrier = carrier
        self._conn = SpdyConnection(Role.CLIENT)
        self._streams: dict[int, ClientStream] = {}
        self._full: set[int] = set()
        self._output = asyncio.Event()
        self._room = asyncio.Event()
        self._drained = asyncio.Event()
        self._ended = asyncio.Event()
        self._heard = asyncio.get_running_loop().time()
        self._ping_interval = ping_interval
        self._run_task = asyncio.create_task(self._run())

    @property
    def usable(self) -> bool:
        """New streams may still be opened."""
        return not self._ended.is_set() and not self._conn.goaway_received

    def open_stream(self, headers: HeadersLike) -> ClientStream:
        """Queue a SYN_STREAM; raises `SpdyError` when the session takes no new stream."""
        stream = ClientStream(self, self._conn.open_stream(headers))
        self._streams[stream.stream_id] = stream
        self._output.set()
        return stream

    async def close(self) -> None:
        """Reset the open streams, send GOAWAY, flush (bounded) and close the carrier."""
        if not self._ended.is_set():
            self._conn.close()
            self._end()
        await asyncio.shield(self._run_task)

    # -- the streams' side --------------------------------------------------------

    def _command(self, command: Callable[[SpdyConnection], object]) -> None:
        if not self._ended.is_set():
            with contextlib.suppress(SpdyError):  # the codec knows the stream is over
                command(self._conn)
            self._output.set()

    async def _send(self, stream: ClientStream, data: bytes) -> None:
        while self._conn.bytes_to_send >= SEND_HIGH_WATER and not self._ended.is_set():
            self._room.clear()
            await self._room.wait()
        if stream.dead or stream._local_ended:
            raise ConnectionResetError(f"stream {stream.stream_id} is closed")
        try:
            self._conn.send_data(stream.stream_id, data)
        except SpdyError as exc:
            raise ConnectionResetError(f"stream {stream.stream_id}: {exc}") from None
        self._output.set()

    def _consumed(self, stream: ClientStream) -> None:
        if stream.stream_id in self._full:
            self._full.discard(stream.stream_id)
            self._drained.set()
        if stream.dead:
            self._streams.pop(stream.stream_id, None)
            self._end_if_done()

    def _end_if_done(self) -> None:
        # After a GOAWAY the server waits for us to hang up once our streams are over.
        if self._conn.goaway_received and not self._streams and not self._ended.is_set():
            self._end()

    # -- the connection's side ----------------------------------------------------

    async def _run(self) -> None:
        helpers = [
            asyncio.create_task(self._read_loop()),
            asyncio.create_task(self._ping_loop()),
        ]
        writer = asyncio.create_task(self._write_loop())
        try:
            await self._ended.wait()
        finally:
            self._end()
            for task in helpers:
                task.cancel()
            await asyncio.wait(helpers)
            # The writer leaves once the queue (resets, GOAWAY last) is out.
            if not (await asyncio.wait([writer], timeout=FLUSH_TIMEOUT))[0]:
                writer.cancel()
                await asyncio.wait([writer])
            await self._carrier.close()

    def _end(self) -> None:
        self._ended.set()
        for stream in list(self._streams.values()):
            stream._kill()
        for event in (self._output, self._room, self._drained):
            event.set()

    async def _read_loop(self) -> None:
        try:
            while True:
                while self._full:
                    self._drained.clear()
                    await self._drained.wait()
                    # Our own reader paused: not the peer's silence.
                    self._heard = asyncio.get_running_loop().time()
                data = await self._carrier.read()
                if not data:
                    break
                self._heard = asyncio.get_running_loop().time()
                for event in self._conn.receive_data(data):
                    self._dispatch(event)
                if self._conn.bytes_to_send:
                    self._output.set()  # echoed pings, resets for the peer's faults
        except OSError:
            pass  # the connection failed: the same as its end
        finally:
            self._end()

    def _dispatch(self, event: Event) -> None:
        match event:
            case StreamReplied(stream_id=sid) if sid in self._streams:
                self._streams[sid]._on_reply()
            case DataReceived(stream_id=sid, data=data) if sid in self._streams:
                stream = self._streams[sid]
                stream._received(data)
                if stream._size >= STREAM_BUFFER:
                    self._full.add(sid)
            case StreamEnded(stream_id=sid) if sid in self._streams:
                self._streams[sid]._on_fin()
            case StreamReset(stream_id=sid) if sid in self._streams:
                self._streams[sid]._kill()
            case GoAwayReceived():
                self._end_if_done()  # else `usable` is False and the streams finish first
            case ConnectionTerminated():
                self._end()  # the codec queued its GOAWAY; the writer flushes it

    async def _write_loop(self) -> None:
        try:
            while True:
                await self._output.wait()
                self._output.clear()
                while chunk := self._conn.data_to_send(WRITE_CHUNK):
                    self._room.set()
                    await self._carrier.write(chunk)
                if self._ended.is_set():
                    return
        except OSError:
            pass  # the connection failed: the same as its end
        finally:
            self._end()

    async def _ping_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self._ping_interval)
            if not self._full and loop.time() - self._heard > 3 * self._ping_interval:
                self._end()  # the peer is gone without a word: a dead route
                return
            self._command(lambda conn: conn.ping())
