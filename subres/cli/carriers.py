"""The CLI's carriers for SPDY/3.1: a raw HTTP/1.1 upgrade, or a WebSocket tunnel.

`upgrade` and `tunnel` open the connection, send the request and read the
`101` themselves, so no HTTP library buffers the first frames and an error
answer's Status body is kept. What they return is a `Carrier` for
`subres.engine.spdy`, which runs the session in the client role.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from websockets.frames import CloseCode, Frame, Opcode
from websockets.protocol import Protocol as WebSocketProtocol
from websockets.protocol import Side
from websockets.protocol import State as WebSocketState

from subres.engine.spdy import FLUSH_TIMEOUT
from subres.protocol import httpstream

__all__ = ["Peer", "SocketCarrier", "UpgradeRefused", "WebSocketCarrier", "tunnel", "upgrade"]

READ_SIZE = 256 * 1024
MAX_HEAD = 64 * 1024
MAX_BODY = 64 * 1024
MAX_MESSAGE = 16 * 1024 * 1024
"""Largest WebSocket message taken from the server (it sends at most 256 KiB)."""
_WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
_DATA_OPCODES = (Opcode.BINARY, Opcode.CONT)  # text is not SPDY: dropped


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


@dataclass(frozen=True)
class Peer:
    """Where the upgrade goes and how: the URL, the caller's headers (credentials), TLS."""

    url: str
    headers: Mapping[str, str]
    tls: ssl.SSLContext | None
    server_hostname: str | None


async def upgrade(peer: Peer, *, protocol: str) -> SocketCarrier:
    """POST a SPDY/3.1 upgrade offering `protocol`; the connection after the `101`.

    Raises `UpgradeRefused` for any other answer, OSError when unreachable.
    """
    request = {
        "Connection": "Upgrade",
        "Upgrade": httpstream.SPDY_UPGRADE,
        httpstream.VERSION_HEADER: protocol,
        "Content-Length": "0",
    }
    socket, answer = await _upgrade("POST", peer, request)
    if answer.get(httpstream.VERSION_HEADER.lower()) != protocol:
        await socket.close()
        raise UpgradeRefused(101, b"the server chose no stream protocol we offered")
    return socket


async def tunnel(peer: Peer, *, subprotocol: str) -> WebSocketCarrier:
    """A WebSocket speaking `subprotocol`, as a carrier; errors as for `upgrade`."""
    key = base64.b64encode(os.urandom(16)).decode()
    request = {
        "Connection": "Upgrade",
        "Upgrade": "websocket",
        "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": key,
        "Sec-WebSocket-Protocol": subprotocol,
    }
    socket, answer = await _upgrade("GET", peer, request)
    accept = base64.b64encode(hashlib.sha1((key + _WS_GUID).encode()).digest()).decode()
    if answer.get("sec-websocket-accept") != accept:
        await socket.close()
        raise UpgradeRefused(101, b"the server's Sec-WebSocket-Accept is wrong")
    if answer.get("sec-websocket-protocol") != subprotocol:
        await socket.close()
        raise UpgradeRefused(101, f"the server does not speak {subprotocol}".encode())
    return WebSocketCarrier(socket)


async def _upgrade(
    method: str, peer: Peer, request: Mapping[str, str]
) -> tuple[SocketCarrier, dict[str, str]]:
    """Send an upgrade request; the connection after a `101` and the answer's headers."""
    parts = urlsplit(peer.url)
    secure = parts.scheme == "https"
    reader, writer = await asyncio.open_connection(
        parts.hostname,
        parts.port or (443 if secure else 80),
        ssl=peer.tls if secure else None,
        server_hostname=peer.server_hostname if secure and peer.server_hostname else None,
        limit=MAX_HEAD,
    )
    socket = SocketCarrier(reader, writer)
    try:
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        lines = [f"{method} {target} HTTP/1.1", f"Host: {parts.netloc}"]
        lines += [f"{name}: {value}" for name, value in {**request, **peer.headers}.items()]
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
