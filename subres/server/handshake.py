"""WebSocket upgrade requests: what they offer, whether they are well formed, the response.

Checked before anything is dialed, so a malformed upgrade costs no backend
connection and gets a Status. aiohttp's own check lets HTTP/1.0 requests and
WebSocket versions 7 and 8 through; RFC 6455 wants HTTP/1.1 or later and
version 13 (anything else is 426 with the version we speak).

A plain GET with `?dryRun=All` (Kubernetes' own dry-run parameter) is a dry
run: the handler checks everything it would before dialing and answers 200
with a Success Status, so a client can fail fast (a stopped machine, a port
not allowed) without taking a session or counting an error. Never an
upgrade: kube-apiserver's proxy turns any answer to an upgrade below 400 but
101 into a 503, and an upgrade is answered 101 or refused.
"""

from __future__ import annotations

import base64
import binascii

from aiohttp import hdrs, web

from subres.engine.wsserver import WebSocketUpgrade
from subres.kube import status
from subres.kube.status import StatusError
from subres.protocol.channels import Dialect, Framing
from subres.server.state import State

__all__ = [
    "VERSION",
    "check",
    "dry_run",
    "dry_run_passed",
    "offered_subprotocols",
    "websocket_response",
]

VERSION = "13"
"""The only WebSocket version RFC 6455 defines."""


def offered_subprotocols(request: web.Request) -> list[str]:
    """The subprotocols a WebSocket request offers, from every header line, in order."""
    return [
        p.strip()
        for header in request.headers.getall(hdrs.SEC_WEBSOCKET_PROTOCOL, [])
        for p in header.split(",")
        if p.strip()
    ]


def websocket_response(
    state: State,
    request: web.Request,
    *,
    what: str,
    subprotocol: str | Dialect,
    autoclose: bool = True,
) -> WebSocketUpgrade:
    """The upgrade of `request` to a WebSocket speaking `subprotocol` ("" none), to accept later.

    Raises a 400 (426 for another WebSocket version) Status naming `what`
    when the request is not a well-formed WebSocket upgrade. A channel
    dialect's binary messages start with their channel byte (`prefix`).
    """
    check(request, what=what)
    session = state.config.session
    dialect = subprotocol if isinstance(subprotocol, Dialect) else None
    return WebSocketUpgrade(
        subprotocol=subprotocol.name if isinstance(subprotocol, Dialect) else subprotocol,
        max_message=session.max_message,
        ping_interval=session.ping_interval,
        prefix=dialect is not None and dialect.framing is Framing.BINARY,
        autoclose=autoclose,
    )


def dry_run(request: web.Request) -> bool:
    """True for `?dryRun=All`; any other `dryRun` value is a 400, as in Kubernetes."""
    asked = request.query.getall("dryRun", [])
    if not asked:
        return False
    if asked != ["All"]:
        raise StatusError(400, f'dryRun must be "All", not {", ".join(map(repr, asked))}')
    if hdrs.UPGRADE in request.headers:
        # An upgrade is answered 101 or refused: never a success that leaves it half-done.
        raise StatusError(400, "a dry run is a plain GET, without Upgrade")
    return True


def dry_run_passed() -> web.Response:
    """The answer to a dry run whose every check passed."""
    return web.json_response(status.success())


def check(request: web.Request, *, what: str) -> None:
    """Raise a Status unless `request` asks for a WebSocket as RFC 6455 says."""
    if request.headers.get(hdrs.UPGRADE, "").lower() != "websocket":
        raise StatusError(400, f"{what} needs a WebSocket upgrade request")
    if request.version < (1, 1):
        raise StatusError(400, f"{what}: a WebSocket upgrade needs HTTP/1.1")
    if request.headers.get(hdrs.SEC_WEBSOCKET_VERSION, "").strip() != VERSION:
        raise StatusError(
            426,
            f"{what}: unsupported WebSocket version; this server speaks {VERSION}",
            headers=[(hdrs.SEC_WEBSOCKET_VERSION, VERSION)],
        )
    connection = ",".join(request.headers.getall(hdrs.CONNECTION, [])).lower()
    if "upgrade" not in (token.strip() for token in connection.split(",")):
        raise StatusError(400, f"{what}: a WebSocket upgrade needs Connection: Upgrade")
    if not _valid_key(request.headers.get(hdrs.SEC_WEBSOCKET_KEY, "")):
        raise StatusError(400, f"{what}: Sec-WebSocket-Key is not 16 bytes in base64")


def _valid_key(key: str) -> bool:
    try:
        return len(base64.b64decode(key.strip(), validate=True)) == 16
    except (binascii.Error, ValueError):
        return False
