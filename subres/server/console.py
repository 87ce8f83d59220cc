"""`…/{resource}/{name}/console`: the serial console over WebSocket, or SPDY remote-command."""

from __future__ import annotations

from aiohttp import hdrs, web

from subres.protocol import httpstream
from subres.server import remotecommand, streaming, subresource
from subres.server.state import State

__all__ = ["SUBPROTOCOLS", "handle"]

SUBPROTOCOLS = (
    "",
    "plain.kubevirt.io",
    "v5.channel.k8s.io",
    "v4.channel.k8s.io",
    "channel.k8s.io",
    "v4.base64.channel.k8s.io",
    "base64.channel.k8s.io",
)
"""Raw framing (no subprotocol or KubeVirt's) and the Kubernetes channel protocols."""


async def handle(state: State, request: web.Request) -> web.StreamResponse:
    """Check, negotiate, dial, then upgrade and stream; one console per machine."""
    if httpstream.is_spdy_upgrade(
        request.headers.getall(hdrs.CONNECTION, []), request.headers.getall(hdrs.UPGRADE, [])
    ):
        return await remotecommand.handle(state, request)
    target = subresource.resolve(state, request, "console")
    url = subresource.endpoint_url(target)
    ws, dialect = streaming.negotiate(state, request, "console", SUBPROTOCOLS)
    backend = await subresource.connect(state, target, url)
    return await streaming.serve(
        state, request, target=target, ws=ws, dialect=dialect, backend=backend, exclusive=True
    )
