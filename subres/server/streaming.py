"""Upgrading to a WebSocket and running a session: the one shared streamer.

Negotiation happens before the backend is dialed (a bad offer is a 400 that
costs no connection); the upgrade happens only after the dial succeeded.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from aiohttp import hdrs, web

from subres.backends.stream import ByteStream
from subres.kube.status import StatusError
from subres.protocol import channels
from subres.protocol.channels import Dialect
from subres.server.state import State
from subres.server.subresource import Target
from subres.streams.pump import Ending, pump
from subres.streams.sessions import SessionKey
from subres.streams.websocket import WebSocketClient

__all__ = ["negotiate", "offered_subprotocols", "serve"]

log = logging.getLogger(__name__)


def offered_subprotocols(request: web.Request) -> list[str]:
    """The subprotocols a WebSocket request offers, from every header line, in order."""
    return [
        p.strip()
        for header in request.headers.getall(hdrs.SEC_WEBSOCKET_PROTOCOL, [])
        for p in header.split(",")
        if p.strip()
    ]


def negotiate(
    state: State, request: web.Request, subresource: str, supported: Sequence[str]
) -> tuple[web.WebSocketResponse, Dialect]:
    """A WebSocket response ready to prepare and the dialect chosen (400 otherwise)."""
    if request.headers.get(hdrs.UPGRADE, "").lower() != "websocket":
        raise StatusError(400, f"{subresource} needs a WebSocket upgrade request")
    offered = offered_subprotocols(request)
    dialect = channels.negotiate(offered, supported)
    if dialect is None:
        listed = ", ".join(p for p in supported if p)
        raise StatusError(
            400, f"unsupported subprotocols {offered} for {subresource}; supported: {listed}"
        )
    session = state.config.session
    ws = web.WebSocketResponse(
        protocols=(dialect.name,) if dialect.name else (),
        compress=False,
        heartbeat=session.ping_interval,
        max_msg_size=session.max_message,
    )
    if not ws.can_prepare(request).ok:
        raise StatusError(400, f"malformed WebSocket upgrade request for {subresource}")
    return ws, dialect


async def serve(
    state: State,
    request: web.Request,
    *,
    target: Target,
    ws: web.WebSocketResponse,
    dialect: Dialect,
    backend: ByteStream,
    exclusive: bool,
) -> web.WebSocketResponse:
    """Upgrade, then pump between the client and `backend` until either ends."""
    name = target.spec.name
    key = SessionKey(name, target.namespace, target.name) if exclusive else None
    client = WebSocketClient(ws, dialect)
    ending = Ending.ERROR
    active = state.metrics.sessions_active.labels(name)
    try:
        await ws.prepare(request)
        state.sessions.start(key, client)
        active.inc()
        try:
            await client.hello()
            ending = await pump(client, backend)
        finally:
            active.dec()
            state.sessions.end(key, client)
    finally:
        await backend.close()
        state.metrics.sessions.labels(name, ending.value).inc()
        log.info("%s of %s ended by %s", name, target.describe(), ending.value)
    return ws
