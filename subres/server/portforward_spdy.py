"""Kubernetes port-forward over SPDY/3.1 (`portforward.k8s.io`), direct or tunnelled in a WebSocket.

The machine is resolved before any upgrade (404/409 stay HTTP Status). After
it, kubelet's stream-pair protocol (`protocol.portforward_spdy`) runs on a
`SpdySession`: every completed error/data pair is one forwarded connection to
a port the machine allows, pumped with half-close both ways. A pair that
fails (port not allowed, dial error, pairing timeout) gets a plain-text
message on its error stream and both its streams end, as kubelet does; the
connection and its other pairs live on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import Any

from aiohttp import web

from subres.engine import upgrade
from subres.engine.pump import Ending, Outcome, Traffic, pump
from subres.engine.spdy import Carrier, SpdySession, SpdyStream
from subres.engine.tunnel import WebSocketCarrier
from subres.engine.websocket import ServerMessages
from subres.kube.status import StatusError
from subres.policies import Limits
from subres.protocol import httpstream
from subres.protocol import portforward_spdy as pairs
from subres.protocol.spdy import Role
from subres.server import handshake, limited, subresource
from subres.server.middleware import who
from subres.server.state import State
from subres.sessions import session
from subres.sessions.target import Target

__all__ = ["PAIRING_TIMEOUT", "handle_spdy", "handle_tunnel", "refusal"]

log = logging.getLogger(__name__)

PAIRING_TIMEOUT = pairs.PAIRING_TIMEOUT
"""Seconds a stream waits for the other of its pair; read at each connection (tests shorten it)."""


async def handle_spdy(state: State, request: web.Request) -> web.StreamResponse:
    """`Upgrade: SPDY/3.1`: negotiate `portforward.k8s.io`, answer 101, serve the pairs."""
    target = subresource.resolve(state, request, "portforward")
    try:
        protocol = httpstream.negotiate(
            request.headers.getall(httpstream.VERSION_HEADER, None), (pairs.PROTOCOL,)
        )
    except httpstream.HandshakeRefused as exc:
        raise refusal(exc) from None
    granted = await limited.admit(state, who(request), target=target)
    response, socket = await upgrade.upgrade(request, httpstream.switching_headers(protocol))
    await _serve(state, request, target, socket, dialect=f"spdy/{protocol}", limits=granted)
    return response


async def handle_tunnel(state: State, request: web.Request) -> web.StreamResponse:
    """A WebSocket offering `SPDY/3.1+portforward.k8s.io`: SPDY in binary messages."""
    target = subresource.resolve(state, request, "portforward")
    ws = handshake.websocket_response(
        state, request, what="portforward", subprotocol=pairs.TUNNEL_PROTOCOL
    )
    granted = await limited.admit(state, who(request), target=target)
    response, conn = await ws.accept(request)
    await _serve(
        state,
        request,
        target,
        WebSocketCarrier(ServerMessages(conn), linger=True),
        dialect=pairs.TUNNEL_PROTOCOL,
        limits=granted,
    )
    return response


def refusal(exc: httpstream.HandshakeRefused) -> StatusError:
    """The Status for a refused SPDY handshake, listing what we accept on a 403."""
    accepted = [(httpstream.ACCEPTED_HEADER, protocol) for protocol in exc.accepted]
    return StatusError(exc.code, exc.message, headers=accepted)


async def _serve(
    state: State,
    request: web.Request,
    target: Target,
    carrier: Carrier,
    *,
    dialect: str,
    limits: Limits,
) -> None:
    spdy = SpdySession(carrier, role=Role.SERVER, ping_interval=state.config.session.ping_interval)
    async with (
        spdy,
        session.live(
            state, who(request), target=target, dialect=dialect, client=spdy, limits=limits
        ) as live,
    ):
        await live.run(_Forwarder(state, target, spdy, live.record.traffic).run())


class _Forwarder:
    """The pairs of one connection: waiting streams, pairing deadlines, forwarding tasks."""

    def __init__(
        self, state: State, target: Target, session: SpdySession, traffic: Traffic
    ) -> None:
        self.state = state
        self.target = target
        self.session = session
        self.traffic = traffic
        self.pairing = pairs.Pairing(timeout=PAIRING_TIMEOUT)
        self.waiting: dict[int, SpdyStream] = {}
        self.tasks: set[asyncio.Task[None]] = set()

    async def run(self) -> Outcome:
        """Accept streams until the session ends, then wait for the forwards to finish."""
        try:
            while (stream := await self._next()) is not None:
                self._add(stream)
        finally:
            for stream in self.waiting.values():
                stream.reset()
            if self.tasks:
                # Every stream is gone with the session, so the pumps end promptly.
                await asyncio.wait(self.tasks)
        return Outcome(Ending.CLIENT, "the client ended the connection")

    async def _next(self) -> SpdyStream | None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                async with asyncio.timeout_at(self.pairing.next_deadline()):
                    return await self.session.accept()
            except TimeoutError:
                for expired in self.pairing.expire(loop.time()):
                    self._spawn(self._timed_out(expired))

    def _add(self, stream: SpdyStream) -> None:
        try:
            checked = pairs.check(stream.stream_id, stream.headers)
        except pairs.StreamRefused as exc:
            log.info("refusing port-forward stream %d: %s", stream.stream_id, exc)
            stream.reset()
            return
        event = self.pairing.add(checked, now=asyncio.get_running_loop().time())
        if isinstance(event, pairs.StreamDuplicated):
            stream.reset()
            if event.error_id is not None:
                self._spawn(_tell(self.waiting[event.error_id], event.message))
            return
        stream.reply()
        self.waiting[stream.stream_id] = stream
        if isinstance(event, pairs.PairCompleted):
            error = self.waiting.pop(event.error_id)
            data = self.waiting.pop(event.data_id)
            self._spawn(self._forward(error, data, event.port))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _timed_out(self, event: pairs.PairTimedOut) -> None:
        log.info("port-forward %s", event.message)
        ended = [self.waiting.pop(i) for i in (event.error_id, event.data_id) if i is not None]
        if event.error_id is not None:
            await _tell(ended[0], event.message)
        for stream in ended:
            await stream.close()

    async def _forward(self, error: SpdyStream, data: SpdyStream, port: int) -> None:
        try:
            url = subresource.forward_url(self.target, port)
            backend = await subresource.connect(self.state, self.target, url)
        except StatusError as exc:
            log.info("port-forward: %s", exc.message)
            await _tell(error, f"error forwarding port {port}: {exc.message}")
            await error.close()
            await data.close()
            return
        try:
            outcome = await pump(data, backend, self.traffic)
            if outcome.ending is Ending.ERROR:
                where = self.target.describe()
                await _tell(error, f"error forwarding port {port}: {where}: {outcome.reason}")
        finally:
            await backend.close()
            await error.close()
            await data.close()


async def _tell(error: SpdyStream, message: str) -> None:
    """Write `message` on an error stream; a stream already gone is left alone."""
    with contextlib.suppress(ConnectionResetError):
        await error.write(message.encode())
