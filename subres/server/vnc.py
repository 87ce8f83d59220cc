"""`…/{resource}/{name}/vnc` and `…/vnc-observe`: the display, shared by its viewers.

Each viewer has its own connection to the VNC server, which shares the
display among them (subres asks it to for every viewer: `sessions.viewer`).
`vnc` is the interactive viewer, validated, dialed and streamed as the
console is (`streaming`): one per machine, a new one takes over, unless it
asks `?preserveSession=true`, which is refused with 409 while another is
live (in cluster mode: while a fresh session Lease is held, by any replica).
`vnc-observe` is a view-only viewer: its input dropped, authorized as its
own subresource, untouched by takeovers and not counted by
`preserveSession`; as many as `session.maxObserversPerConsole` per display
(and `session.maxObservers` per replica, with the consoles' observers).
"""

from __future__ import annotations

from aiohttp import web

from subres.server import handshake, session, sharing, streaming, subresource
from subres.server.state import State
from subres.sessions.viewer import GuardedDisplay

__all__ = ["SUBPROTOCOLS", "handle", "observe"]

SUBPROTOCOLS = ("", "plain.kubevirt.io", "binary")
"""Raw binary: no subprotocol, KubeVirt's, or noVNC's `binary`."""


async def handle(state: State, request: web.Request) -> web.StreamResponse:
    """The interactive viewer: check, negotiate, dial, then upgrade and stream."""
    # Spelled as KubeVirt parses it (Go's strconv.ParseBool).
    preserve = request.query.get("preserveSession", "").lower() in ("1", "t", "true")
    target = subresource.resolve(state, request, "vnc")
    return await _view(state, request, target, view_only=False, preserve=preserve)


async def observe(state: State, request: web.Request) -> web.StreamResponse:
    """A view-only viewer: check, negotiate, dial, then upgrade and stream; input dropped."""
    target = subresource.resolve(state, request, "vnc")
    with sharing.watching(state, target):  # a place among its observers first (429)
        return await _view(state, request, target, view_only=True, preserve=False)


async def _view(
    state: State,
    request: web.Request,
    target: subresource.Target,
    *,
    view_only: bool,
    preserve: bool,
) -> web.StreamResponse:
    url = subresource.endpoint_url(target)
    if handshake.dry_run(request):  # `subres vnc` checks before it listens
        await subresource.vet(state, target, url)
        return handshake.dry_run_passed()
    ws, dialect = streaming.negotiate(state, request, "vnc", SUBPROTOCOLS)
    if preserve and state.sessions.active(session.key(target)):
        raise session.busy(target)  # without dialing; `session.hold` decides for certain
    backend = await subresource.connect(state, target, url)
    return await streaming.serve(
        state,
        request,
        target=target,
        ws=ws,
        dialect=dialect,
        backend=GuardedDisplay(backend, view_only=view_only),
        exclusive=not view_only,
        preserve=preserve,
        mode=session.OBSERVER if view_only else session.VIEWER,
    )
