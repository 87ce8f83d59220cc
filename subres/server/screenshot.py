"""`…/{resource}/{name}/screenshot`: the VNC framebuffer as `image/png`.

A plain GET, its own subresource so RBAC can grant screenshots without
interactive access. Also served at KubeVirt's `…/vnc/screenshot`, whose
`moveCursor` query is accepted and, as in virt-api v1.7.0, not acted on (it
would be input to a display a viewer-only role may not touch). It opens its
own connection to the VNC server (shared, so a live `vnc` session is neither
taken over nor disturbed), reads one framebuffer within
`session.screenshotTimeout`, and encodes it off the event loop. Unreachable
backend: 503; no framebuffer in time: 504; a server that refuses or breaks
the protocol: 502.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from subres.backends import rfb as vnc
from subres.kube.status import StatusError
from subres.protocol import png, rfb
from subres.server import subresource
from subres.server.state import State

__all__ = ["handle"]


async def handle(state: State, request: web.Request) -> web.StreamResponse:
    """Check, dial, capture, encode."""
    target = subresource.resolve(state, request, "screenshot")
    url = subresource.endpoint_url(target)
    backend = await subresource.connect(state, target, url)
    try:
        shot = await vnc.capture(backend, deadline=state.config.session.screenshot_timeout)
    except vnc.CaptureTimedOut as exc:
        raise StatusError(504, f"{target.describe()}: VNC server {url}: {exc}") from None
    except vnc.CaptureFailed as exc:
        raise StatusError(502, f"{target.describe()}: VNC server {url}: {exc}") from None
    finally:
        await backend.close()
    body = await asyncio.to_thread(_png, shot)
    return web.Response(body=body, content_type="image/png", headers={"Cache-Control": "no-store"})


def _png(shot: rfb.FramebufferCaptured) -> bytes:
    return png.encode_rgb(width=shot.width, height=shot.height, rgb=rfb.to_rgb(shot.pixels))
