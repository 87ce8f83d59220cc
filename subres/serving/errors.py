"""Every failure of a request answered as a Kubernetes `Status` with its code.

A request that asked to upgrade (`Connection: Upgrade`) and is answered
anything but 101 gets `Connection: close`, and the connection is closed
after the answer. Behind a proxy that keeps a connection after a failed
upgrade and lets its client write on (CVE-2018-1002105), the next bytes
would otherwise be read as a new request arriving with the proxy's own
credentials. Such a request is never redirected either (proxies once
followed redirects of upgrades: CVE-2020-8559): it gets a 400. A failure
nobody expected is a 500 `Status` too, never a traceback or aiohttp's
plain text.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable

from aiohttp import hdrs, web

from subres.kube.status import StatusError

__all__ = ["asks_upgrade", "errors", "status_response"]

log = logging.getLogger(__name__)

MESSAGES = {
    404: "the server could not find the requested resource",
    405: "the server does not allow this method on the requested resource",
}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def status_response(error: StatusError) -> web.Response:
    """The HTTP answer for `error`."""
    response = web.Response(
        status=error.code,
        body=json.dumps(error.to_dict()).encode(),
        content_type="application/json",
    )
    for name, value in error.headers:
        response.headers.add(name, value)
    return response


def asks_upgrade(request: web.Request) -> bool:
    """Whether `request` asks to switch protocols (`Connection: Upgrade` and `Upgrade`)."""
    tokens = (
        token.strip().lower()
        for header in request.headers.getall(hdrs.CONNECTION, [])
        for token in header.split(",")
    )
    return "upgrade" in tokens and hdrs.UPGRADE in request.headers


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turn every failure into a Status answer; close what a failed upgrade leaves."""
    try:
        response = await handler(request)
    except StatusError as exc:
        response = status_response(exc)
    except web.HTTPException as exc:
        if exc.status < 400 and not asks_upgrade(request):
            raise
        response = status_response(_status(request, exc))
    except Exception:
        if request.writer is None or request.writer.output_size:
            raise  # an answer has begun: aiohttp closes the connection
        log.exception("%s %s failed", request.method, request.path)
        response = status_response(StatusError(500, "an internal error occurred"))
        response.force_close()
    _close_after_failed_upgrade(request, response)
    return response


def _status(request: web.Request, exc: web.HTTPException) -> StatusError:
    if exc.status < 400:
        # A redirect of an upgrade is what proxies once followed (CVE-2020-8559).
        return StatusError(400, f"{request.path} cannot be upgraded")
    default = f"{exc.status}: {exc.reason}"
    text = exc.text if exc.text and exc.text != default else None
    return StatusError(exc.status, text or MESSAGES.get(exc.status, exc.reason))


def _close_after_failed_upgrade(request: web.Request, response: web.StreamResponse) -> None:
    if response.status != 101 and asks_upgrade(request):
        response.force_close()
