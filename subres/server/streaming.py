"""A console or vnc session over a WebSocket: negotiate, then upgrade and pump.

Negotiation happens before the backend is dialed (a bad offer is a 400 that
costs no connection); the upgrade happens only after the dial succeeded and
the session holds its slot (and its place in a recording).
"""

from __future__ import annotations

from collections.abc import Sequence

from aiohttp import web

from subres.engine.pump import pump
from subres.engine.stream import ByteStream, Terminal
from subres.engine.websocket import WebSocketClient
from subres.engine.wsserver import WebSocketUpgrade
from subres.kube.status import StatusError
from subres.protocol import channels
from subres.protocol.channels import Dialect
from subres.server import handshake, limited
from subres.server.middleware import USER, who
from subres.server.state import State
from subres.sessions import limits, session
from subres.sessions.modes import Mode
from subres.sessions.target import Target

__all__ = ["negotiate", "serve"]


def negotiate(
    state: State, request: web.Request, subresource: str, supported: Sequence[str]
) -> tuple[WebSocketUpgrade, Dialect]:
    """A WebSocket upgrade ready to accept and the dialect chosen (400 otherwise)."""
    handshake.check(request, what=subresource)
    offered = handshake.offered_subprotocols(request)
    dialect = channels.negotiate(offered, supported)
    if dialect is None:
        listed = ", ".join(p for p in supported if p)
        raise StatusError(
            400, f"unsupported subprotocols {offered} for {subresource}; supported: {listed}"
        )
    ws = handshake.websocket_response(state, request, what=subresource, subprotocol=dialect)
    return ws, dialect


async def serve(
    state: State,
    request: web.Request,
    *,
    target: Target,
    ws: WebSocketUpgrade,
    dialect: Dialect,
    backend: ByteStream,
    exclusive: bool,
    preserve: bool = False,
    mode: Mode | None = None,
    owner: bool = True,
) -> web.StreamResponse:
    """Take the session's slot, upgrade, then pump between the client and `backend`.

    `owner` False: `backend` relays to the replica that owns the unit, which
    holds the slot and records.
    """
    try:
        granted = await limited.admit(state, who(request), target=target, mode=mode)
        ws.headers.extend(limits.headers(granted).items())
        async with session.hold(
            state,
            request[USER].name,
            target=target,
            exclusive=exclusive,
            preserve=preserve,
            mode=mode,
            owner=owner,
        ) as held:
            response, conn = await ws.accept(request)
            client = WebSocketClient(conn, dialect, terminal=Terminal(backend))
            async with session.live(
                state,
                who(request),
                target=target,
                dialect=dialect.name,
                client=client,
                held=held,
                mode=mode,
                backend=backend,
                limits=granted,
            ) as live:
                await client.hello()
                await live.run(pump(client, backend, live.record.traffic))
    finally:
        await backend.close()
    return response
