"""`…/{resource}/{name}/screenshot`: the VNC framebuffer as `image/png`.

A plain GET, its own subresource so RBAC can grant screenshots without
interactive access. Also served at KubeVirt's `…/vnc/screenshot`, whose
`moveCursor` query is accepted and, as in virt-api v1.7.0, not acted on (it
would be input to a display a viewer-only role may not touch). It opens its
own connection to the VNC server (shared, so a live `vnc` session is neither
taken over nor disturbed), reads one framebuffer within
`session.screenshotTimeout`, and streams the PNG while encoding it off the
event loop, a piece at a time. Unreachable backend: 503; no framebuffer in
time: 504; a server that refuses or breaks the protocol, or a framebuffer over
`session.screenshotMaxPixels`: 502.

Memory is bounded: a capture holds its framebuffer (3 bytes a pixel) and
nothing else of that size, and at most `session.screenshotConcurrency`
captures run at once; the others wait for a slot as long as the timeout
allows, then get 429.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

from aiohttp import web

from subres.backends import rfb as vnc
from subres.kube.status import StatusError
from subres.protocol import png, rfb
from subres.server import subresource
from subres.server.state import State

__all__ = ["handle"]


async def handle(state: State, request: web.Request) -> web.StreamResponse:
    """Check, wait for a slot, dial, capture, stream the PNG."""
    target = subresource.resolve(state, request, "screenshot")
    url = subresource.endpoint_url(target)
    session = state.config.session
    try:
        async with asyncio.timeout(session.screenshot_timeout):
            await state.screenshot_slots.acquire()
    except TimeoutError:
        raise StatusError(
            429,
            f"{target.describe()}: {session.screenshot_concurrency} screenshots are being "
            "captured; try again shortly",
            details={"retryAfterSeconds": 1},
            headers=[("Retry-After", "1")],
        ) from None
    try:
        shot = await _capture(state, target, url)
        return await _send(request, shot, deadline=session.screenshot_timeout)
    finally:
        state.screenshot_slots.release()


async def _capture(state: State, target: subresource.Target, url: str) -> rfb.FramebufferCaptured:
    session = state.config.session
    backend = await subresource.connect(state, target, url)
    try:
        return await vnc.capture(
            backend,
            deadline=session.screenshot_timeout,
            limits=rfb.Limits(max_pixels=session.screenshot_max_pixels),
        )
    except vnc.CaptureTimedOut as exc:
        raise StatusError(504, f"{target.describe()}: VNC server {url}: {exc}") from None
    except vnc.CaptureFailed as exc:
        raise StatusError(502, f"{target.describe()}: VNC server {url}: {exc}") from None
    finally:
        await backend.close()


async def _send(
    request: web.Request, shot: rfb.FramebufferCaptured, *, deadline: float
) -> web.StreamResponse:
    """Encode and send a piece at a time; a client too slow to take it in time is cut off."""
    response = web.StreamResponse(headers={"Cache-Control": "no-store"})
    response.content_type = "image/png"
    await response.prepare(request)
    pieces = png.stream(width=shot.width, height=shot.height, row=shot.row)
    try:
        async with asyncio.timeout(deadline):
            while piece := await asyncio.to_thread(_next, pieces):
                await response.write(piece)
            await response.write_eof()
    except TimeoutError:
        # The status line is gone: all that is left to say is an incomplete body.
        if request.transport is not None:
            request.transport.abort()
    return response


def _next(pieces: Iterator[bytes]) -> bytes:
    return next(pieces, b"")
