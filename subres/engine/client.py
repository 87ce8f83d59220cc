"""The one HTTP/1.1 upgrade client: SPDY, WebSockets and the node agent's relay open this way.

`upgrade` dials (TCP, TLS, through an HTTP CONNECT proxy when there is one),
sends one request and reads the answer with h11. On `101` the connection is
the new protocol's: an `UpgradedStream`, whose bytes after the answer go to
`upgraded_data` (the `SocketStream` queue unless a subclass frames them). Any
other answer is `UpgradeRefused` with its status and the start of its body
(a Kubernetes `Status`, kept so the user reads the server's own words). No
HTTP library buffers the first bytes of the new protocol.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import ssl
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar, cast
from urllib.parse import urlsplit

import h11

from subres.engine.sockets import SocketStream

__all__ = [
    "MAX_BODY",
    "Peer",
    "UpgradeRefused",
    "UpgradedStream",
    "proxy_for",
    "upgrade",
    "websocket_accept",
    "websocket_key",
]

MAX_BODY = 64 * 1024
"""Most bytes of a refusal's body kept."""
HIGH_WATER = 1024 * 1024
"""Bytes received and unread before the connection stops reading."""
WRITE_TIMEOUT = 60.0
"""Seconds a write may wait on a server that takes nothing."""
_WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

S = TypeVar("S", bound="UpgradedStream")


@dataclass(frozen=True)
class Peer:
    """Where an upgrade goes and how: the URL, extra headers (credentials), TLS, proxy."""

    url: str
    """`http(s)://` or `ws(s)://` with path and query."""
    headers: Mapping[str, str] = field(default_factory=dict)
    tls: ssl.SSLContext | None = None
    """For `https`/`wss`; None: the system's trust."""
    server_hostname: str | None = None
    """The name the server's certificate must have, when not the URL's host."""
    proxy: str | None = None
    """`http://host:port` of an HTTP CONNECT proxy; None: straight to the server."""

    @property
    def secure(self) -> bool:
        """The URL asks for TLS."""
        return urlsplit(self.url).scheme in ("https", "wss")


class UpgradeRefused(Exception):
    """The server answered with `status` (and `body`) instead of `101`."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"the server answered {status}")
        self.status = status
        self.body = body


def proxy_for(url: str, configured: str | None) -> str | None:
    """The proxy for `url`: the configured one, else the environment's (HTTPS_PROXY, NO_PROXY)."""
    if configured:
        return configured
    parts = urlsplit(url)
    scheme = "https" if parts.scheme in ("https", "wss") else "http"
    proxy = urllib.request.getproxies().get(scheme)
    if not proxy or urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    return proxy


def websocket_key() -> str:
    """A fresh `Sec-WebSocket-Key`."""
    return base64.b64encode(os.urandom(16)).decode()


def websocket_accept(key: str) -> str:
    """The `Sec-WebSocket-Accept` a server must answer `key` with (RFC 6455 4.2.2)."""
    return base64.b64encode(hashlib.sha1(key.encode() + _WS_GUID).digest()).decode()


class UpgradedStream(SocketStream):
    """A connection that sent an upgrade request: the answer goes to h11, then bytes flow.

    `headers` holds the 101's headers (lowercase names, in order), `answer`
    the same by name (the last of each). Subclasses that frame the new
    protocol override `upgraded_data`.
    """

    __slots__ = ("_body", "_http", "_settled", "_status", "answer", "headers")

    def __init__(
        self,
        *,
        high_water: int = HIGH_WATER,
        write_timeout: float = WRITE_TIMEOUT,
        peer: str = "server",
    ) -> None:
        super().__init__(high_water=high_water, write_timeout=write_timeout, peer=peer)
        self.headers: list[tuple[str, str]] = []
        self.answer: dict[str, str] = {}
        self._http: h11.Connection | None = h11.Connection(h11.CLIENT)
        self._settled: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # An answer that arrives after the caller gave up is nobody's to raise: mark it seen.
        self._settled.add_done_callback(_retrieve)
        self._status = 0
        self._body = bytearray()

    @property
    def upgraded(self) -> bool:
        """The `101` arrived: bytes are the new protocol's."""
        return self._http is None

    async def request(self, method: str, target: str, headers: list[tuple[str, str]]) -> None:
        """Send the request; return after the `101`, raise `UpgradeRefused` for anything else."""
        assert self._http is not None and self._transport is not None
        head = self._http.send(h11.Request(method=method, target=target, headers=headers))
        end = self._http.send(h11.EndOfMessage())
        self._transport.write((head or b"") + (end or b""))
        await self._settled

    def upgraded_data(self, data: bytes) -> None:
        """Bytes of the new protocol: queued for `read`."""
        super().data_received(data)

    def data_received(self, data: bytes) -> None:
        """The answer, then the new protocol's bytes."""
        if self._http is None:
            self.upgraded_data(data)
        else:
            self._answer_received(data)

    def eof_received(self) -> bool:
        """The server half-closed; over TLS that is the end (asyncio cannot half-close TLS)."""
        super().eof_received()
        return self._transport is None or self._transport.get_extra_info("sslcontext") is None

    def connection_lost(self, exc: Exception | None) -> None:
        """Before the answer ended, a lost connection fails the request."""
        if self._http is not None:
            why = f": {exc}" if exc else ""
            self._settle(ConnectionError(f"the {self._peer} closed the connection{why}"))
        super().connection_lost(exc)

    def _answer_received(self, data: bytes) -> None:
        http = self._http
        assert http is not None
        try:
            http.receive_data(data)
            while (event := http.next_event()) is not h11.NEED_DATA:
                if self._answer_event(http, event):
                    return
        except h11.ProtocolError as exc:
            self._settle(ConnectionError(f"the {self._peer}'s answer is not HTTP: {exc}"))

    def _answer_event(self, http: h11.Connection, event: object) -> bool:
        """Take one h11 event of the answer; True once the answer is complete."""
        if isinstance(event, h11.InformationalResponse) and event.status_code == 101:
            self.headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in event.headers]
            self.answer = dict(self.headers)
            leftover, _ = http.trailing_data
            self._http = None
            self._settle(None)
            if leftover:
                self.upgraded_data(bytes(leftover))
            return True
        if isinstance(event, h11.Response):
            self._status = event.status_code
        elif isinstance(event, h11.Data):
            self._body += event.data[: MAX_BODY - len(self._body)]
        elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed | h11.PAUSED):
            self._settle(UpgradeRefused(self._status, bytes(self._body)))
            return True
        return False

    def _settle(self, outcome: Exception | None) -> None:
        if self._settled.done():
            return
        if outcome is None:
            self._settled.set_result(None)
            return
        self._settled.set_exception(outcome)
        if self._transport is not None:
            self._transport.close()


def _retrieve(answer: asyncio.Future[None]) -> None:
    if not answer.cancelled():
        answer.exception()


async def upgrade(
    peer: Peer,
    *,
    method: str,
    headers: Mapping[str, str],
    stream: Callable[[], S],
) -> S:
    """Dial `peer`, ask for an upgrade with `headers` (and the peer's), return the connection.

    `Host` is the URL's unless `headers` name one (an agent is reached by
    address but asked as `subres-agent`).

    `stream` makes the protocol object (an `UpgradedStream`). Raises
    `UpgradeRefused` for an answer other than `101`, `ConnectionError` when the
    server hangs up or does not speak HTTP, OSError (ssl.SSLError) when it
    cannot be reached. The caller bounds the time.
    """
    parts = urlsplit(peer.url)
    secure = peer.secure
    host = parts.hostname or ""
    port = parts.port or (443 if secure else 80)
    tls = (peer.tls or ssl.create_default_context()) if secure else None
    name = _name(peer, host) if tls else None
    transport: asyncio.BaseTransport
    if peer.proxy:
        transport, conn = await _through_proxy(
            peer.proxy, host=host, port=port, stream=stream, tls=tls, server_hostname=name
        )
    else:
        loop = asyncio.get_running_loop()
        transport, conn = await loop.create_connection(
            stream, host, port, ssl=tls, server_hostname=name
        )
    target = parts.path or "/"
    if parts.query:
        target += f"?{parts.query}"
    pairs = [*headers.items(), *peer.headers.items()]
    if not any(name.lower() == "host" for name, _ in pairs):
        pairs.insert(0, ("Host", parts.netloc.rpartition("@")[2]))
    try:
        await conn.request(method, target, pairs)
    except BaseException:
        cast(asyncio.Transport, transport).abort()
        raise
    return conn


def _name(peer: Peer, host: str) -> str:
    return peer.server_hostname or host


async def _through_proxy(
    proxy: str,
    *,
    host: str,
    port: int,
    stream: Callable[[], S],
    tls: ssl.SSLContext | None,
    server_hostname: str | None,
) -> tuple[asyncio.BaseTransport, S]:
    """A connection to `host:port` through the HTTP(S) proxy at `proxy` (CONNECT).

    An https proxy is reached over TLS with the same context, as client-go
    does; the server's TLS then runs inside the tunnel.
    """
    parts = urlsplit(proxy)
    if parts.scheme not in ("http", "https"):
        raise ConnectionError(f"proxy {proxy!r}: only http and https proxies are supported")
    loop = asyncio.get_running_loop()
    proxy_tls = (tls or ssl.create_default_context()) if parts.scheme == "https" else None
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    transport, tunnel = await loop.create_connection(
        lambda: _Connect(authority),
        parts.hostname or "",
        parts.port or (443 if proxy_tls else 80),
        ssl=proxy_tls,
        server_hostname=parts.hostname if proxy_tls else None,
    )
    try:
        await tunnel.answered(proxy)
        conn = stream()
        if tls is None:
            transport.set_protocol(conn)
            conn.connection_made(transport)
            return transport, conn
        inner = await loop.start_tls(transport, conn, tls, server_hostname=server_hostname)
        if inner is None:
            raise ConnectionError("TLS to the server through the proxy did not start")
        conn.connection_made(inner)
    except BaseException:
        transport.abort()
        raise
    return inner, conn


class _Connect(asyncio.Protocol):
    """The CONNECT exchange with a proxy, before the connection is handed on."""

    def __init__(self, authority: str) -> None:
        self._authority = authority
        self._http = h11.Connection(h11.CLIENT)
        self._answer: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._answer.add_done_callback(_retrieve_int)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        request = h11.Request(
            method="CONNECT", target=self._authority, headers=[("Host", self._authority)]
        )
        data = self._http.send(request) + (self._http.send(h11.EndOfMessage()) or b"")
        cast(asyncio.Transport, transport).write(data)

    def data_received(self, data: bytes) -> None:
        try:
            self._http.receive_data(data)
            event = self._http.next_event()
        except h11.ProtocolError as exc:
            self._settle(ConnectionError(f"the proxy's answer is not HTTP: {exc}"))
            return
        if isinstance(event, h11.Response):
            if self._http.trailing_data[0]:
                self._settle(ConnectionError("the proxy sent bytes before the server did"))
            elif not self._answer.done():
                self._answer.set_result(event.status_code)

    def connection_lost(self, exc: Exception | None) -> None:
        self._settle(ConnectionError("the proxy closed the connection"))

    def _settle(self, error: Exception) -> None:
        if not self._answer.done():
            self._answer.set_exception(error)

    async def answered(self, proxy: str) -> None:
        """Return once the proxy opened the tunnel; raise when it refused."""
        status = await self._answer
        if not 200 <= status < 300:
            raise ConnectionError(f"proxy {proxy} refused the tunnel: {status}")


def _retrieve_int(answer: asyncio.Future[int]) -> None:
    if not answer.cancelled():
        answer.exception()
