"""`subres port-forward --transport spdy|tunnel`: stream pairs on one SPDY/3.1 upstream.

As kubectl and client-go forward: every local connection is an `error` and a
`data` stream on ONE SPDY/3.1 connection, upgraded from HTTP/1.1 (`spdy`) or
tunnelled in a WebSocket (`tunnel`, `SPDY/3.1+portforward.k8s.io`). Text on a
pair's error stream is printed and ends that local connection. The upstream
is dialled for the first connection, and again at once when it drops (the
server going away or the connection lost), saying so; with `--no-reconnect`
its loss ends the command (`subres.cli.reconnect.Drops`).
"""

from __future__ import annotations

import asyncio
import itertools
import sys
from collections.abc import Mapping
from typing import ClassVar

from subres.cli import api, reconnect
from subres.cli.api import CommandError, Target
from subres.cli.kubeconfig import ClientConfig
from subres.engine import client, wsclient
from subres.engine.spdy import FLUSH_TIMEOUT, Carrier, SpdySession, SpdyStream
from subres.engine.tunnel import WebSocketCarrier
from subres.protocol import httpstream
from subres.protocol import portforward_spdy as pairs
from subres.protocol.spdy import Role, SpdyError

__all__ = ["SpdyLink", "SpdyTransport", "TunnelTransport"]

OPEN_TIMEOUT = 30.0
COMPLAINT_WAIT = 5.0
"""After a data stream ends, seconds its error stream may take to end (with any message)."""
MAX_COMPLAINT = 64 * 1024
MAX_MESSAGE = 16 * 1024 * 1024
"""Largest tunnelled WebSocket message taken from the server (it sends at most 256 KiB)."""
PING_INTERVAL = 5.0
"""client-go's SPDY ping period; three silent periods end the session."""


class SpdyLink:
    """A `Link` over a port-forward stream pair: bytes on `data`, the server's
    complaints (plain text) on `error`."""

    def __init__(self, error: SpdyStream, data: SpdyStream) -> None:
        self._error = error
        self._data = data
        self._complaint = asyncio.create_task(_complaint(error, data))

    async def write(self, data: bytes) -> None:
        await self._data.write(data)

    async def read(self) -> bytes:
        """The next chunk; b"" at the end; `CommandError` with the server's complaint."""
        if chunk := await self._data.read():
            return chunk
        # The server writes its complaint before it ends the pair.
        done, _ = await asyncio.wait([self._complaint], timeout=COMPLAINT_WAIT)
        if done and (message := self._complaint.result()):
            raise CommandError(message)
        return b""

    async def write_eof(self) -> None:
        await self._data.write_eof()

    async def close(self) -> None:
        self._complaint.cancel()
        await asyncio.wait([self._complaint])
        self._error.reset()
        self._data.reset()


async def _complaint(error: SpdyStream, data: SpdyStream) -> str:
    """Everything the server writes on `error`; a complaint also ends `data`."""
    text = b""
    while len(text) < MAX_COMPLAINT and (chunk := await error.read()):
        text += chunk
    if text:
        data.reset()
    return text.decode("utf-8", "replace").strip()


class SpdyTransport:
    """Every connection a stream pair on one SPDY/3.1 upgrade of `…/portforward`, as client-go.

    The upgrade is made for the first connection and made again for the next
    connection after it dropped or the server sent GOAWAY.
    """

    udp: ClassVar[bool] = False

    def __init__(
        self, config: ClientConfig, *, group_version: str, target: Target, drops: reconnect.Drops
    ) -> None:
        self._config = config
        self._target = target
        self._base = api.object_url(config, target, group_version=group_version, websocket=False)
        self._drops = drops
        self._client: SpdySession | None = None
        self._dialing = asyncio.Lock()
        self._request_ids = itertools.count()
        self._following: asyncio.Task[None] | None = None
        self._pacing = reconnect.Pacing()

    async def open(self, remote: int, protocol: str) -> SpdyLink:
        client = await self._session()
        common = {
            pairs.PORT_HEADER: str(remote),
            pairs.REQUEST_ID_HEADER: str(next(self._request_ids)),
        }
        try:
            error = client.open_stream({pairs.STREAM_TYPE_HEADER: pairs.ERROR, **common})
            await error.write_eof()  # we never write on it, as client-go
            data = client.open_stream({pairs.STREAM_TYPE_HEADER: pairs.DATA, **common})
        except SpdyError as exc:
            raise CommandError(f"cannot open a stream: {exc}") from None
        try:
            async with asyncio.timeout(OPEN_TIMEOUT):
                await error.wait_replied()
                await data.wait_replied()
        except (ConnectionResetError, TimeoutError):
            error.reset()
            data.reset()
            raise CommandError("the server did not accept the port-forward streams") from None
        return SpdyLink(error, data)

    async def close(self) -> None:
        if self._following is not None:
            self._following.cancel()
            await asyncio.wait([self._following])
        if self._client is not None:
            await self._client.close()

    async def _session(self) -> SpdySession:
        async with self._dialing:
            if self._client is None or not self._client.usable:
                self._client = SpdySession(
                    await self._dial(), role=Role.CLIENT, ping_interval=PING_INTERVAL
                )
                self._client.start()
                self._following = asyncio.create_task(self._follow(self._client))
            return self._client

    async def _follow(self, client: SpdySession) -> None:
        """When the upstream ends (not by us), say so and dial it again at once."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        await client.wait_ended()
        what = "the SPDY connection to the server ended"
        self._drops.dropped(what, then="reconnecting")
        if not self._drops.reconnect:
            return
        left = await self._pacing.next(lasted=loop.time() - started)
        try:
            await reconnect.retrying(
                self._session,
                within=max(left, 0.0),
                worth_it=reconnect.reconnecting(self._config, self._say),
            )
        except CommandError as exc:
            print(f"error: cannot reconnect: {exc}", file=sys.stderr, flush=True)
            return  # the next local connection tries again
        print(f"Reconnected to {self._target}.", file=sys.stderr, flush=True)

    def _say(self, line: str) -> None:
        print(f"{self._target}: {line}", file=sys.stderr, flush=True)

    async def _dial(self) -> Carrier:
        async def attempt(headers: Mapping[str, str]) -> Carrier:
            try:
                return await self._upgrade(f"{self._base}/portforward", headers)
            except client.UpgradeRefused as exc:
                raise api.refusal(exc.status, exc.body, target=self._target) from None

        try:
            async with asyncio.timeout(OPEN_TIMEOUT):
                return await api.authorized(self._config, attempt)
        except (OSError, TimeoutError) as exc:
            raise api.unreachable(self._config, exc) from None

    async def _upgrade(self, url: str, headers: Mapping[str, str]) -> Carrier:
        """POST a SPDY/3.1 upgrade for port-forward; the connection after the 101."""
        request = {
            "Connection": "Upgrade",
            "Upgrade": httpstream.SPDY_UPGRADE,
            httpstream.VERSION_HEADER: pairs.PROTOCOL,
            "Content-Length": "0",
        }
        conn = await client.upgrade(
            api.peer(self._config, url, headers),
            method="POST",
            headers=request,
            stream=client.UpgradedStream,
        )
        if conn.answer.get(httpstream.VERSION_HEADER.lower()) != pairs.PROTOCOL:
            await conn.close()
            raise ConnectionError("the server chose no stream protocol we offered")
        return conn


class TunnelTransport(SpdyTransport):
    """The same stream pairs, the SPDY bytes in one WebSocket (`SPDY/3.1+portforward.k8s.io`)."""

    async def _upgrade(self, url: str, headers: Mapping[str, str]) -> Carrier:
        ws = await wsclient.connect(
            api.peer(self._config, url, headers),
            subprotocols=[pairs.TUNNEL_PROTOCOL],
            max_size=MAX_MESSAGE,
            close_timeout=FLUSH_TIMEOUT,
        )
        return WebSocketCarrier(ws, linger=False)
