"""`…/{resource}/{name}/vnc`: the VNC server's raw byte stream over a WebSocket.

Validated, dialed and streamed exactly as the console is (`streaming`): one
session per machine, a new one takes over, unless it asks
`?preserveSession=true`, which is refused with 409 while another is live.
"""

from __future__ import annotations

from aiohttp import web

from subres.kube.status import StatusError
from subres.server import streaming, subresource
from subres.server.state import State
from subres.server.subresource import Target
from subres.streams.sessions import SessionKey

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
    key = SessionKey(target.spec.name, target.namespace, target.name)
    if preserve and state.sessions.active(key):
        raise _busy(target)
    backend = await subresource.connect(state, target, url)
    if preserve and state.sessions.active(key):
        await backend.close()  # another session started while we dialed
        raise _busy(target)
    return await streaming.serve(
        state, request, target=target, ws=ws, dialect=dialect, backend=backend, exclusive=True
    )


def _busy(target: Target) -> StatusError:
    return StatusError(
        409,
        f"{target.describe()} already has a VNC session; "
        "connect without preserveSession=true to take it over",
    )
