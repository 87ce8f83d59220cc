"""The peer port (`--peer-port`): what replicas ask of each other, over mutual TLS.

Only replicas get in: the handshake demands a client certificate from the
internal CA, and `serving.tls.replica_caller` checks it names a replica.

- `POST /peer/v1/session` (`Upgrade: subres-peer.v1`): a session fronted by
  the caller, served here because this replica owns its unit
  (`sessions.peer`).
- `GET /peer/v1/sessions`: the sessions this replica fronts, as `Session`
  objects (`sessionlist` merges every replica's).
- `GET /peer/v1/recordings/{resource}/{namespace}/{name}` and `…/{file}`: this
  replica's recordings of a machine (`recordinglist` merges them).
- `DELETE /peer/v1/moderated/{resource}/{subresource}/{namespace}/{name}?user=`:
  a moderator fronted by the caller (`user`: `auth.user.encode`) ends the moderated
  session here (`moderate`).
- `GET /peer/v1/log/{resource}/{namespace}/{name}`: the log of a console this
  replica owns and keeps, whole or followed (`log` streams it through).
"""

from __future__ import annotations

import functools
import logging

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler

from subres.auth import user
from subres.backends.peer import UPGRADE
from subres.engine import upgrade
from subres.kube.status import StatusError
from subres.protocol import relay
from subres.server import log as logs
from subres.server import moderate, recordinglist, sessionlist
from subres.server.state import State
from subres.serving import certs, errors
from subres.serving.tls import replica_caller
from subres.sessions import peer, sharing

__all__ = ["REPLICA_NAME", "build"]

log = logging.getLogger(__name__)

REPLICA_NAME = certs.REPLICA_IDENTITY
"""The name in every replica certificate (`subres certs`): its CN, and its DNS name as server."""


def build(state: State) -> web.Application:
    """The peer application, timed by the same connection guard as the main port's: its
    upgraded sessions run no timer, its idle keep-alive connections are reaped."""
    # Room for a user carried whole (`auth.user.encode`), in a header or a query.
    room = user.MAX_ENCODED + 1024
    # The handshake required a replica certificate: past `_replicas_only`, the caller is one.
    app = state.connections.application(
        [errors.errors, _replicas_only],
        authenticated=lambda _: True,
        handler_args={"max_field_size": room, "max_line_size": room},
    )
    recordings = "/peer/v1/recordings/{resource}/{namespace}/{name}"
    app.router.add_post("/peer/v1/session", functools.partial(_session, state))
    app.router.add_get("/peer/v1/sessions", functools.partial(sessionlist.fronted, state))
    app.router.add_get(recordings, functools.partial(recordinglist.local_listing, state))
    app.router.add_get(recordings + "/{file}", functools.partial(recordinglist.local_one, state))
    moderated = "/peer/v1/moderated/{resource}/{subresource}/{namespace}/{name}"
    app.router.add_delete(moderated, functools.partial(moderate.end_here, state))
    app.router.add_get(
        "/peer/v1/log/{resource}/{namespace}/{name}", functools.partial(logs.owned, state)
    )
    return app


@web.middleware
async def _replicas_only(request: web.Request, handler: Handler) -> web.StreamResponse:
    replica_caller(request.transport, frozenset({REPLICA_NAME}))
    return await handler(request)


async def _session(state: State, request: web.Request) -> web.StreamResponse:
    """Serve a session another replica fronts: prepare, answer 101, relay to its end."""
    if request.headers.get(hdrs.UPGRADE, "").lower() != UPGRADE:
        raise StatusError(400, f"a peer session needs `Upgrade: {UPGRADE}`")
    one = {name: request.headers.get(name, "") for name in _HEADERS if name in request.headers}
    ask = peer.parse(one)
    prepared = await peer.prepare(state, ask)
    headers: list[tuple[str, str]] = [("Connection", "Upgrade"), ("Upgrade", UPGRADE)]
    beat = relay.heartbeat_interval(request.headers.get(relay.HEARTBEAT_HEADER))
    if beat is not None:
        headers.append((relay.HEARTBEAT_HEADER, f"{beat:g}"))
    if prepared.target.spec.name == "usbredir":
        headers.append(("Subres-Unit", prepared.target.spec.unit))  # the slot it chose
    if prepared.held.seat is not None:
        headers.append(("Subres-Recorded", "true"))
    if prepared.target.spec.name == "console" and sharing.keeps_scrollback(state, prepared.target):
        headers.append(("Subres-Scrollback", "true"))
    try:
        response, carrier = await upgrade.upgrade(request, headers)
    except BaseException:
        peer.release(state, prepared)
        await prepared.backend.close()
        raise
    if request.transport is not None:
        # As the agent relay does: a few frames in flight rather than a pause per frame.
        request.transport.set_write_buffer_limits(high=4 * state.config.session.read_size)
    if beat is not None:
        carrier.start_heartbeat(beat, relay.heartbeat())
    await peer.serve(state, prepared, carrier)
    return response


_HEADERS = (
    "Subres-Unit",
    "Subres-Mode",
    "Subres-User",
    "Subres-Client",
    "Subres-Request-Id",
    "Subres-Front",
    "Subres-Preserve",
    "Subres-Tail",
)
