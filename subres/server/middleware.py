"""Request middleware: authentication and authorization.

Errors leave as `Status` objects through `serving.errors`. Authentication and
authorization run before any handler, so a request that is refused never
reaches the code that dials a backend.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable

from aiohttp import hdrs, web
from aiohttp.typedefs import Middleware

from subres.auth import attributes
from subres.auth.authn import Credentials, Unauthenticated
from subres.auth.user import UserInfo
from subres.kube.status import StatusError
from subres.protocol import channels
from subres.server.handshake import offered_subprotocols
from subres.server.state import State
from subres.serving.tls import peer_certificate
from subres.sessions.runtime import Who

__all__ = ["USER", "authenticated", "identity", "who"]

log = logging.getLogger(__name__)

USER = web.RequestKey("user", UserInfo)
"""Request key of the authenticated `UserInfo`."""
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def identity(state: State) -> Middleware:
    """Middleware that authenticates and authorizes before any handler runs.

    Handlers never forward request headers (backends only ever receive the
    session's bytes), so the credentials stay here without copying the request:
    a copy would cost every idle session another Request object.
    """

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        # A streaming handler runs for hours inside this frame: keep nothing in it
        # but the request (the credentials and attributes die with `_admit`'s frame).
        request[USER] = await _admit(state, request)
        return await handler(request)

    return middleware


async def _admit(state: State, request: web.Request) -> UserInfo:
    """The request's user, if authenticated and authorized (401, 403 otherwise)."""
    creds = _credentials(request)
    try:
        user = await state.authenticator.authenticate(creds)
    except Unauthenticated as exc:
        log.info("%s %s: unauthenticated: %s", request.method, request.path, exc)
        raise StatusError(401, "Unauthorized") from None
    attrs = attributes.from_request(request.method, request.path, request.query)
    decision = await state.authorizer.authorize(user, attrs)
    if not decision.allowed:
        if user.anonymous:
            raise StatusError(401, "Unauthorized")
        raise StatusError(403, _forbidden(user.name, attrs), details=_details(attrs))
    return user


def who(request: web.Request) -> Who:
    """Who made an authenticated request, from where, under which request id."""
    return Who(
        identity=request[USER],
        client=request.remote or "",
        request_id=request.headers.get("Audit-Id") or str(uuid.uuid4()),
        transport=request.transport,
    )


def authenticated(request: web.Request) -> bool:
    """Whether `identity` let this request through as someone other than anonymous."""
    user = request.get(USER)
    return user is not None and not user.anonymous


def _credentials(request: web.Request) -> Credentials:
    auth = request.headers.get(hdrs.AUTHORIZATION, "")
    scheme, _, value = auth.partition(" ")
    token = value.strip() if scheme.lower() == "bearer" and value.strip() else None
    if token is None:
        token = channels.bearer_token(offered_subprotocols(request))
    return Credentials(
        token=token, certificate=peer_certificate(request.transport), headers=request.headers
    )


def _forbidden(user: str, attrs: attributes.Attributes) -> str:
    if not attrs.resource_request:
        return f'forbidden: User "{user}" cannot {attrs.describe()}'
    target = f"{attrs.resource}.{attrs.group}"
    name = f' "{attrs.name}"' if attrs.name else ""
    return f'{target}{name} is forbidden: User "{user}" cannot {attrs.describe()}'


def _details(attrs: attributes.Attributes) -> dict[str, str] | None:
    if not attrs.resource_request:
        return None
    return {"name": attrs.name, "group": attrs.group, "kind": attrs.resource}
