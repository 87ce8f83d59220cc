"""Every failure of a request answered as a Kubernetes `Status` with its code."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

from aiohttp import web

from subres.kube.status import StatusError

__all__ = ["errors", "status_response"]

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


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turn every failure into a Status answer."""
    try:
        return await handler(request)
    except StatusError as exc:
        return status_response(exc)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        default = f"{exc.status}: {exc.reason}"
        text = exc.text if exc.text and exc.text != default else None
        return status_response(
            StatusError(exc.status, text or MESSAGES.get(exc.status, exc.reason))
        )
