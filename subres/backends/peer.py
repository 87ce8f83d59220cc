"""Another replica, reached over mutual TLS: the front's side of a peer session.

A replica that fronts a session for a unit another replica owns asks the
owner for a *peer session* (`subres-peer.v1`, see `sessions.peer` for the
headers) and gets back a `PeerStream`: the `ByteStream` every session pumps,
built on the agent relay's client (`backends.agent`). Besides bytes it
carries a console's window size (`resize`, a RESIZE frame) and, from the
owner, how the session ended for its client (a CLOSE frame, handed to the
closer the session gave `attached`) and the exit status of the command its
backend ran (an EXIT frame before the EOF: `exit_code`, which the front's
session reports as its own backend's). A connection lost without EOF, ERROR
or CLOSE means the owner was lost: the client is closed with 1001.

The replica's certificate (`subres certs`' `replica.*`) serves as client
here and as server on the peer port; both sides check the other's against
the internal CA and the replica name.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

import aiohttp
import h11

from subres.backends.agent import ClientTLS, RelayStream, Request, open_relay, status_message
from subres.backends.stream import BackendUnavailable
from subres.engine.sockets import SocketStream
from subres.protocol import relay
from subres.protocol.channels import TerminalSize

__all__ = ["GOING_AWAY", "UPGRADE", "AnswerCut", "PeerRefused", "PeerStream", "Peers"]

UPGRADE = "subres-peer.v1"
PATH = "/peer/v1/session"
GOING_AWAY = 1001
"""The close code of a session whose owner moved or was lost: reconnect."""

Closer = Callable[[int, str], None]


class PeerRefused(BackendUnavailable):
    """The owner answered with a Status (or could not be reached: 503); `code` is passed on."""


class AnswerCut(OSError):
    """An answer that ended before its Content-Length or its last chunk, or ran past the
    bound it was read with: never to be used as if it were whole."""


class PeerStream(RelayStream):
    """A session relayed to the replica that owns its unit."""

    __slots__ = ("_closer", "_ended", "exit_code", "owner")

    def __init__(self, *, owner: str, high_water: int, write_timeout: float) -> None:
        super().__init__(
            high_water=high_water,
            write_timeout=write_timeout,
            where=f"the replica {owner} owning this console",
            peer=True,
        )
        self.owner = owner
        self._closer: Closer | None = None
        self._ended: tuple[int, str] | None = None
        self.exit_code: int | None = None
        """The owner's backend's exit status, once its EXIT frame came (read as a backend's)."""

    @property
    def recorded(self) -> bool:
        """The owner records the session."""
        return self.answer.get("subres-recorded") == "true"

    @property
    def unit(self) -> str:
        """Which of the machine's units the owner gave (a USB slot it chose), if it says."""
        return self.answer.get("subres-unit", "")

    @property
    def keeps_scrollback(self) -> bool:
        """The owner keeps the console, with a scrollback to replay (`?tail=`)."""
        return self.answer.get("subres-scrollback") == "true"

    def attached(self, closer: Closer) -> None:
        """How to close the session's client: with the owner's CLOSE, or 1001 when it is lost."""
        self._closer = closer
        if self._ended is not None:
            closer(*self._ended)

    def resize(self, size: TerminalSize) -> None:
        """The client's window changed size: tell the owner."""
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(relay.resize(size.width, size.height))

    def control(self, event: relay.Control) -> None:
        """The owner's backend exited with a status, or it ended the session (a takeover, a
        move): close the client so."""
        if isinstance(event, relay.ExitReceived):
            self.exit_code = event.code
        elif isinstance(event, relay.CloseReceived):
            self._end(event.code, event.reason)
            SocketStream.eof_received(self)  # the relay's own waits for the connection's end

    def connection_lost(self, exc: Exception | None) -> None:
        """Lost without a goodbye: the owner died or moved; the client should reconnect."""
        if not self._eof and self._ended is None and self.upgraded:
            lost = f"the replica {self.owner} owning this console was lost"
            self._end(GOING_AWAY, self._failure or lost)
        super().connection_lost(exc)

    async def close(self) -> None:
        """The front's session is over: hang up, and tell its client nothing more."""
        if self._ended is None:
            self._ended = (1000, "")
        await super().close()

    def _end(self, code: int, reason: str) -> None:
        if self._ended is None:
            self._ended = (code, reason)
            if self._closer is not None:
                self._closer(code, reason)

    def refusal(self, status: int, body: bytes) -> Exception:
        """The owner's Status, passed on with its code."""
        message = status_message(body) or f"the replica {self.owner} answered {status}"
        return PeerRefused(message, status)


@dataclass(frozen=True)
class Peers:
    """How this replica reaches the others: their address and the replica certificate."""

    tls: ClientTLS | None
    """None without a replica certificate: only this replica's own units can be served."""
    connect_timeout: float
    read_size: int
    write_timeout: float
    heartbeat: float | None = None
    """Seconds between heartbeats on peer sessions (both ends beat; None: neither)."""

    async def open(
        self, owner: str, address: tuple[str, int], headers: Sequence[tuple[str, str]]
    ) -> PeerStream:
        """A peer session on `owner` at `address` (`PeerRefused` with the owner's code)."""
        if self.tls is None:
            raise PeerRefused(
                f"the replica {owner} owns this unit, and this replica has no replica "
                "certificate to reach it (--agent-client-cert-file)",
                503,
            )
        where = f"the replica {owner} at {address[0]}:{address[1]}"
        try:
            return await open_relay(
                lambda: PeerStream(
                    owner=owner, high_water=4 * self.read_size, write_timeout=self.write_timeout
                ),
                address,
                context=self.tls.context(),
                server_name=self.tls.server_name,
                connect_timeout=self.connect_timeout,
                request=Request(PATH, UPGRADE, "subres-replica", list(headers)),
                heartbeat=self.heartbeat,
            )
        except PeerRefused:
            raise
        except TimeoutError:
            message = f"{where}, which owns this unit, did not answer within "
            raise PeerRefused(f"{message}{self.connect_timeout:g}s", 503) from None
        except (OSError, ssl.SSLError, h11.ProtocolError, ValueError, BackendUnavailable) as exc:
            raise PeerRefused(f"cannot reach {where}, which owns this unit: {exc}", 503) from None

    @contextlib.asynccontextmanager
    async def opened(
        self, address: tuple[str, int], path: str
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """A GET of `path` of the replica at `address`, its answer open to read as it comes
        (a log followed); `OSError` when it cannot be asked within the connect timeout."""
        if self.tls is None:
            raise OSError("this replica has no replica certificate to reach the others")
        host, port = address
        url = f"https://{f'[{host}]' if ':' in host else host}:{port}{path}"
        timeout = aiohttp.ClientTimeout(total=None, connect=self.connect_timeout)
        try:
            async with (
                aiohttp.ClientSession(timeout=timeout) as http,
                http.get(
                    url, ssl=self.tls.context(), server_hostname=self.tls.server_name
                ) as response,
            ):
                yield response
        except aiohttp.ClientError as exc:
            raise OSError(str(exc)) from None

    async def get(self, address: tuple[str, int], path: str, *, limit: int) -> tuple[int, bytes]:
        """GET `path` of the replica at `address`: its status and whole body (at most `limit`
        bytes).

        Raises `AnswerCut` when the body is cut short or larger than `limit`,
        `OSError` (or `TimeoutError`) when it cannot be asked; the caller
        bounds the time.
        """
        return await self.call("GET", address, path, limit=limit)

    async def call(
        self, method: str, address: tuple[str, int], path: str, *, limit: int
    ) -> tuple[int, bytes]:
        """`method` `path` of the replica at `address`, as `get` does."""
        if self.tls is None:
            raise OSError("this replica has no replica certificate to reach the others")
        host, port = address
        url = f"https://{f'[{host}]' if ':' in host else host}:{port}{path}"
        try:
            async with (
                aiohttp.ClientSession() as http,
                http.request(
                    method, url, ssl=self.tls.context(), server_hostname=self.tls.server_name
                ) as response,
            ):
                return response.status, await _whole(response, limit=limit, url=url)
        except aiohttp.ClientError as exc:
            raise OSError(str(exc)) from None


async def _whole(response: aiohttp.ClientResponse, *, limit: int, url: str) -> bytes:
    """All of `response`'s body, however many reads it takes; `AnswerCut` when it ends before
    it said it would, or would pass `limit` bytes."""
    declared = response.content_length
    if declared is not None and declared > limit:
        raise AnswerCut(f"the answer of {url} is larger than {limit} bytes ({declared})")
    body = bytearray()
    try:
        async for piece in response.content.iter_any():
            body += piece
            if len(body) > limit:
                raise AnswerCut(f"the answer of {url} is larger than {limit} bytes")
    except aiohttp.ClientPayloadError as exc:
        # aiohttp's word for a connection that ended inside the body (length or chunks).
        cut = f"the answer of {url} was cut short after {len(body)} bytes: {exc}"
        raise AnswerCut(cut) from None
    if declared is not None and len(body) != declared:
        raise AnswerCut(f"the answer of {url} was cut short: {len(body)} of {declared} bytes")
    return bytes(body)
