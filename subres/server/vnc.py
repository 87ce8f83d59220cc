"""`…/{resource}/{name}/vnc`: the VNC server's raw byte stream over a WebSocket.

Validated, dialed and streamed exactly as the console is (`streaming`): one
session per machine, a new one takes over, unless it asks
`?preserveSession=true`, which is refused with 409 while another is live
(in cluster mode: while a fresh session Lease is held, by any replica).
"""

from __future__ import annotations

from aiohttp import web

from subres.server import session, streaming, subresource
from subres.server.state import State

__all__ = ["SUBPROTOCOLS", "handle"]

SUBPROTOCOLS = ("", "plain.kubevirt.io", "binary")
"""Raw binary: no subprotocol, KubeVirt's, or noVNC's `binary`."""


async def handle(state: State, request: web.Request) -> web.StreamResponse:
    """Check, negotiate, dial, then upgrade and stream; one VNC session per machine."""
    target = subresource.resolve(state, request, "vnc")
    url = subresource.endpoint_url(target)
    ws, dialect = streaming.negotiate(state, request, "vnc", SUBPROTOCOLS)
    # Spelled as KubeVirt parses it (Go's strconv.ParseBool).
    preserve = request.query.get("preserveSession", "").lower() in ("1", "t", "true")
    if preserve and state.sessions.active(session.key(target)):
        raise session.busy(target)  # without dialing; `session.hold` decides for certain
    backend = await subresource.connect(state, target, url)
    return await streaming.serve(
        state,
        request,
        target=target,
        ws=ws,
        dialect=dialect,
        backend=backend,
        exclusive=True,
        preserve=preserve,
    )
