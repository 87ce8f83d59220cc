"""Node-local endpoints, reached through the subres agent of their node.

A replica cannot dial a VM's unix socket on another node; that node's agent
can. `Agents.dial` opens one mutual-TLS connection to the agent per
session (no multiplexing: a session's failure is its own), asks it for one
endpoint (`protocol.relay`), and hands back a `RelayStream`: the same
`ByteStream` every backend yields, so every subresource works through it.

Failures keep the dial-before-upgrade promise: no agent for the node, or
one that cannot be reached, is `AgentUnavailable` (503 naming the node); an
agent that refuses or fails its own dial is `AgentRefused` with its code
(403 with its policy's reason, 502/503 when its dial failed). Once relaying,
an agent that dies makes `read` raise `ConnectionResetError`: a lost relay
is a failure, never a clean end of the session. So does one that falls
silent: relays beat (`engine.heartbeat`) when the agent agrees to.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar
from urllib.parse import urlsplit

from subres.backends.endpoint import Endpoint, Target
from subres.backends.stream import BackendUnavailable
from subres.engine import client
from subres.engine.client import UpgradedStream
from subres.engine.heartbeat import Heartbeat
from subres.engine.stream import Chunk
from subres.protocol import relay

__all__ = [
    "AgentRefused",
    "AgentUnavailable",
    "Agents",
    "ClientTLS",
    "Directory",
    "RelayStream",
    "Request",
    "StaticDirectory",
    "open_relay",
    "parse_agent_url",
    "status_message",
]

log = logging.getLogger(__name__)


class AgentUnavailable(BackendUnavailable):
    """No agent serves the node, or it cannot be reached."""


class AgentRefused(BackendUnavailable):
    """The agent answered, but with a refusal; `code` is the status to pass on."""


class Directory(Protocol):
    """Where each node's agent listens."""

    def url(self, node: str) -> str | None:
        """`https://host:port` of the agent of `node`, or None when none serves it."""
        ...

    def follow(self, changed: Callable[[], None]) -> None:
        """Call `changed()` whenever the agent of some node changes."""
        ...


@dataclass(frozen=True)
class StaticDirectory:
    """Agents named on the command line (standalone mode: `--agent NODE=URL`)."""

    urls: Mapping[str, str]

    def url(self, node: str) -> str | None:
        """The URL given for `node`."""
        return self.urls.get(node)

    def follow(self, changed: Callable[[], None]) -> None:
        """Agents named on the command line never change."""


def parse_agent_url(url: str) -> tuple[str, int]:
    """Host and port of `https://host:port`; ValueError otherwise."""
    parts = urlsplit(url)
    if parts.scheme != "https" or not parts.hostname or parts.path not in ("", "/"):
        raise ValueError(f"agent URL {url!r} is not https://HOST:PORT")
    return parts.hostname, parts.port or 443


_Stamp = tuple[int, int, int] | None


class ClientTLS:
    """The replica's side of mutual TLS with agents, rebuilt when its files change.

    The agent's certificate must chain to `ca` and name `server_name` (one name
    for every agent: they are reached by pod address, which no certificate
    made in advance can name).
    """

    def __init__(self, *, cert: Path, key: Path, ca: Path, server_name: str) -> None:
        self.server_name = server_name
        self._files = (cert, key, ca)
        self._stamps: tuple[_Stamp, ...] | None = None
        self._context: ssl.SSLContext | None = None

    def context(self) -> ssl.SSLContext:
        """The current context (certificate rotation takes effect at the next dial)."""
        stamps = tuple(_stamp(path) for path in self._files)
        if self._context is None or stamps != self._stamps:
            cert, key, ca = self._files
            context = ssl.create_default_context(cafile=str(ca))
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.load_cert_chain(cert, key)
            self._context, self._stamps = context, stamps
        return self._context


def _stamp(path: Path) -> _Stamp:
    # As serving/tls.py stamps its files; the layers keep backends from importing it.
    try:
        status = os.stat(path)
    except OSError:
        return None
    return (status.st_mtime_ns, status.st_size, status.st_ino)


@dataclass(frozen=True)
class Agents:
    """How this replica reaches node agents."""

    directory: Directory
    tls: ClientTLS | None
    """None when no client certificate is configured: every agent dial then fails."""

    async def dial(
        self,
        node: str,
        target: Target,
        *,
        datagram: bool,
        connect_timeout: float,
        read_size: int,
        write_timeout: float,
        heartbeat: float | None = None,
        purpose: str = "",
    ) -> RelayStream:
        """A relayed connection to `target` through the agent of `node`, beating every
        `heartbeat` seconds when the agent agrees to."""
        url = self.directory.url(node)
        if url is None:
            raise AgentUnavailable(f'no subres agent serves node "{node}"')
        if self.tls is None:
            raise AgentUnavailable(
                f'node "{node}" needs its subres agent, and this server has no agent certificate'
            )
        host, port = parse_agent_url(url)
        where = f'the subres agent of node "{node}" at {url}'
        try:
            context = self.tls.context()
        except (OSError, ValueError) as exc:
            raise AgentUnavailable(f"cannot load the agent client certificate: {exc}") from None
        transport = relay.Transport.DATAGRAM if datagram else relay.Transport.STREAM
        headers = [
            (relay.ENDPOINT_HEADER, _wire_endpoint(target.endpoint, target.address)),
            (relay.TRANSPORT_HEADER, transport.value),
        ]
        if purpose:
            headers.append((relay.FOR_HEADER, purpose))

        def protocol() -> RelayStream:
            return RelayStream(
                high_water=4 * read_size,
                write_timeout=write_timeout,
                where=where,
                datagram=datagram,
            )

        try:
            return await open_relay(
                protocol,
                (host, port),
                context=context,
                server_name=self.tls.server_name,
                connect_timeout=connect_timeout,
                request=Request(relay.PATH, relay.UPGRADE, "subres-agent", headers),
                heartbeat=heartbeat,
            )
        except TimeoutError:
            raise AgentUnavailable(f"{where} did not answer within {connect_timeout:g}s") from None
        except AgentRefused as exc:
            raise AgentRefused(f'subres agent of node "{node}": {exc}', exc.code) from None
        except OSError as exc:
            raise AgentUnavailable(f"{where} is unreachable: {exc}") from None


_S = TypeVar("_S", bound="RelayStream")


@dataclass(frozen=True)
class Request:
    """The upgrade request that opens a relay."""

    path: str
    upgrade: str
    host: str
    headers: list[tuple[str, str]]


async def open_relay(
    protocol: Callable[[], _S],
    address: tuple[str, int],
    *,
    context: ssl.SSLContext,
    server_name: str,
    connect_timeout: float,
    request: Request,
    heartbeat: float | None = None,
) -> _S:
    """Connect over TLS, send `request` and return the stream after its 101, in time.

    The one upgrade client (`subres.engine.client`) does the HTTP; a refusal
    becomes the stream's `refusal`. With `heartbeat`, the request asks both
    ends to beat every that many seconds, and the stream beats once the 101
    agrees. Raises `TimeoutError`, the connection's errors (OSError), or that
    refusal.
    """
    made: list[_S] = []

    def stream() -> _S:
        made.append(protocol())
        return made[-1]

    host, port = address
    names = [name.lower() for name, _ in request.headers]
    if len(set(names)) != len(names):
        # The upgrade takes a mapping: a repeated header would lose all but its last value.
        raise ValueError(f"a relay request repeats a header: {sorted(names)}")
    peer = client.Peer(
        f"https://{f'[{host}]' if ':' in host else host}:{port}{request.path}",
        tls=context,
        server_hostname=server_name,
    )
    headers = {
        "Host": request.host,
        "Connection": "Upgrade",
        "Upgrade": request.upgrade,
        "Content-Length": "0",
        **dict(request.headers),
    }
    if heartbeat is not None:
        headers[relay.HEARTBEAT_HEADER] = f"{heartbeat:g}"
    try:
        async with asyncio.timeout(connect_timeout):
            conn = await client.upgrade(peer, method="POST", headers=headers, stream=stream)
    except client.UpgradeRefused as exc:
        raise made[-1].refusal(exc.status, exc.body) from None
    # TLS's default 64 KiB would pause on every 64 KiB frame: keep a few in flight.
    conn.set_write_high_water(conn.high_water)
    agreed = relay.heartbeat_interval(conn.answer.get(relay.HEARTBEAT_HEADER.lower()))
    if heartbeat is not None and agreed == heartbeat:
        conn.start_heartbeat(heartbeat)
    return conn


def _wire_endpoint(endpoint: Endpoint, address: str) -> str:
    """What the agent is asked to dial: the checked address, never a name to resolve again."""
    if endpoint.scheme == "unix":
        return str(endpoint)
    return str(Endpoint(endpoint.scheme, host=address or endpoint.host, port=endpoint.port))


class RelayStream(UpgradedStream):
    """A `ByteStream` over one relay connection: frames inside mutual TLS.

    The upgrade client reads the answer; after its 101 the bytes are frames,
    whose payloads take `SocketStream`'s queue and flow control.
    """

    __slots__ = ("_decoder", "_failure", "_heartbeat", "_where", "high_water")

    def __init__(
        self,
        *,
        high_water: int,
        write_timeout: float,
        where: str,
        datagram: bool = False,
        peer: bool = False,
    ) -> None:
        super().__init__(high_water=high_water, write_timeout=write_timeout, peer="agent")
        self.high_water = high_water
        self._decoder = relay.FrameDecoder(partial=not datagram, peer=peer)
        self._failure: str | None = None
        self._where = where
        """The other end in words (`the subres agent of node "a" at https://…`)."""
        self._heartbeat: Heartbeat | None = None

    def start_heartbeat(self, interval: float) -> None:
        """Beat every `interval` seconds; drop the relay once the other end fell silent."""
        self._heartbeat = Heartbeat(
            interval, beat=self._beat, expire=self._silent, reading=lambda: self.reading
        )
        self._heartbeat.start()

    def _beat(self) -> None:
        transport = self._transport
        # Queued bytes will tell the other end as much, once it reads them.
        idle = transport is not None and not transport.get_write_buffer_size()
        if idle and transport is not None and not transport.is_closing():
            transport.write(relay.heartbeat())

    def _silent(self, why: str) -> None:
        # The reason reaches clients in a close frame (123 bytes): `why` goes to the log.
        log.info("%s stopped answering: %s", self._where, why)
        if self._failure is None:
            self._failure = f"{self._where} stopped answering"
        if self._transport is not None:
            self._transport.abort()

    def upgraded_data(self, data: bytes) -> None:
        """Frames from the other end."""
        if self._heartbeat is not None:
            self._heartbeat.heard()
        self._frames_received(data)

    def _frames_received(self, data: bytes) -> None:
        try:
            events = self._decoder.feed(data)
        except relay.FrameError as exc:
            self._failure = f"the agent broke the relay protocol: {exc}"
            if self._transport is not None:
                self._transport.abort()
            return
        for event in events:
            if isinstance(event, relay.DataReceived):
                if event.data:
                    super().upgraded_data(event.data)
            elif isinstance(event, relay.EofReceived):
                super().eof_received()
            elif isinstance(event, relay.ErrorReceived):
                self._failure = event.reason
                super().eof_received()
            else:
                self.control(event)

    def control(self, event: relay.Control) -> None:
        """A peer relay's RESIZE, CLOSE or EXIT frame (an agent's decoder yields none)."""

    def refusal(self, status: int, body: bytes) -> Exception:
        """The exception for a non-101 answer."""
        return _refusal(status, body)

    def eof_received(self) -> bool:
        """TLS ended without our EOF frame: wait for `connection_lost` to say so."""
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        """Without an EOF or ERROR frame first, the relay was lost."""
        if self._heartbeat is not None:
            self._heartbeat.stop()
        if self.upgraded and not self._eof and self._failure is None:
            self._failure = f"{self._where} was lost" + (f": {exc}" if exc else "")
        # After the agent's EOF frame the end is clean, whatever TLS said on closing.
        failure = self._failure
        super().connection_lost(None if failure is None else ConnectionResetError(failure))

    async def read(self) -> bytes:
        """The next chunk (or datagram); b"" after the agent's EOF; raises if the relay failed."""
        chunk = await super().read()
        if not chunk and self._failure is not None:
            raise ConnectionResetError(self._failure)
        return chunk

    async def write(self, data: bytes) -> None:
        """Send `data` as one frame (one datagram in datagram mode)."""
        await super().write(relay.data(data))

    async def writelines(self, chunks: list[Chunk]) -> None:
        """Send each chunk as a frame, all in one write."""
        await super().writelines([relay.data(chunk) for chunk in chunks])

    async def write_eof(self) -> None:
        """Tell the agent we are done sending; its backend sees EOF."""
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(relay.eof())


def status_message(body: bytes) -> str:
    """The message of a `Status` body, or its first bytes when it is not one ("" for none)."""
    try:
        decoded = json.loads(body)
    except ValueError:
        decoded = None
    if isinstance(decoded, dict) and decoded.get("message"):
        return str(decoded["message"])
    return body[:200].decode(errors="replace")


def _refusal(status: int, body: bytes) -> Exception:
    """The exception for an agent's non-101 answer, with the message of its Status."""
    message = status_message(body) or f"HTTP {status}"
    if status in (403, 502, 503):
        return AgentRefused(message, status)
    if status == 504:
        return AgentRefused(message, 503)
    return AgentUnavailable(f"the agent answered {status}: {message}")
