"""`…/{resource}/{name}/portforward`: which dialect a client speaks, and where it goes.

Kubernetes-style clients come as SPDY/3.1 (`portforward.k8s.io`), as SPDY
tunnelled in a WebSocket (`SPDY/3.1+portforward.k8s.io`), or as a channel
WebSocket with `?ports=`; KubeVirt-style clients open one raw WebSocket per
connection at `…/portforward/{port}[/{protocol}]`.
"""

from __future__ import annotations

from aiohttp import hdrs, web

from subres.kube.status import StatusError
from subres.server import handshake, portforward_spdy, portforward_ws
from subres.server.handshake import offered_subprotocols
from subres.server.state import State

__all__ = ["TUNNEL_PROTOCOL", "handle", "handle_port"]

TUNNEL_PROTOCOL = "SPDY/3.1+portforward.k8s.io"


async def handle(state: State, request: web.Request) -> web.StreamResponse:
    """Dispatch a Kubernetes-style port-forward by its upgrade."""
    upgrade = request.headers.get(hdrs.UPGRADE, "").lower()
    if upgrade == "spdy/3.1":
        return await portforward_spdy.handle_spdy(state, request)
    if upgrade == "websocket" and TUNNEL_PROTOCOL in offered_subprotocols(request):
        return await portforward_spdy.handle_tunnel(state, request)
    if upgrade == "websocket" or handshake.dry_run(request):
        # A dry run is a plain GET: the channel handler runs the checks, then answers it.
        return await portforward_ws.handle_channels(state, request)
    raise StatusError(400, "portforward needs a SPDY/3.1 or WebSocket upgrade request")


async def handle_port(state: State, request: web.Request) -> web.StreamResponse:
    """KubeVirt-style: one raw WebSocket per forwarded connection."""
    return await portforward_ws.handle_port(state, request)
