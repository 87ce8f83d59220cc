"""`…/{resource}/{name}/vnc` and `…/vnc-observe`: the display, shared by its viewers.

Each viewer has its own connection to the VNC server, which shares the
display among them (subres asks it to for every viewer: `sessions.viewer`).
`vnc` is the interactive viewer, validated, dialed and streamed as the
console is (`streaming`): one per machine, a new one takes over, unless it
asks `?preserveSession=true`, which is refused with 409 while another is
live. The display's owner (`sessions.members`) holds the viewer's slot and
dials; when that is another replica, this one relays to it (`sessions.peer`).
`vnc-observe` is a view-only viewer: its input dropped, authorized as its
own subresource, untouched by takeovers and not counted by
`preserveSession`; counted as an observer (`sessions.sharing.watching`: 429
past `session.maxObserversPerConsole` per display or `session.maxObservers`).
`vnc-moderate` is a view-only viewer who moderates: a moderated viewer waits
for one (`sessions.moderation`).
"""

from __future__ import annotations

from aiohttp import web

from subres.engine.stream import ByteStream
from subres.server import handshake, streaming, subresource
from subres.server.middleware import who
from subres.server.state import State
from subres.sessions import peer, session, sharing
from subres.sessions.modes import Mode
from subres.sessions.target import key
from subres.sessions.viewer import InputWatch

__all__ = ["SUBPROTOCOLS", "handle", "observe"]

SUBPROTOCOLS = ("", "plain.kubevirt.io", "binary")
"""Raw binary: no subprotocol, KubeVirt's, or noVNC's `binary`."""


async def handle(state: State, request: web.Request) -> web.StreamResponse:
    """The interactive viewer: check, negotiate, dial, then upgrade and stream."""
    # Spelled as KubeVirt parses it (Go's strconv.ParseBool).
    preserve = request.query.get("preserveSession", "").lower() in ("1", "t", "true")
    return await _view(state, request, mode=Mode.VIEWER, preserve=preserve)


async def observe(state: State, request: web.Request) -> web.StreamResponse:
    """A view-only viewer: check, negotiate, dial, then upgrade and stream; input dropped."""
    return await _view(state, request, mode=Mode.OBSERVER, preserve=False)


async def moderate(state: State, request: web.Request) -> web.StreamResponse:
    """A moderator: a view-only viewer whom a moderated viewer waits for."""
    return await _view(state, request, mode=Mode.MODERATOR, preserve=False)


async def _view(
    state: State, request: web.Request, *, mode: Mode, preserve: bool
) -> web.StreamResponse:
    target = subresource.resolve(state, request, "vnc")
    url = subresource.endpoint_url(target)  # 400 before anything else when there is none
    if handshake.dry_run(request):  # `subres vnc` checks before it listens
        await subresource.vet(state, target, url)
        return handshake.dry_run_passed()
    ws, dialect = streaming.negotiate(state, request, "vnc", SUBPROTOCOLS)
    view_only = mode != Mode.VIEWER
    if mode == Mode.MODERATOR:
        sharing.may_moderate(state, target, who(request))  # before asking the owner
    relayed = await peer.front(state, target, who(request), mode=mode, preserve=preserve, tail=None)
    if relayed is not None:
        backend: ByteStream = relayed
    else:
        if preserve and state.sessions.active(key(target)):
            raise session.busy(target)  # without dialing; `session.hold` decides for certain
        backend = await sharing.display(state, target, who(request), mode=mode)
    return await streaming.serve(
        state,
        request,
        target=target,
        ws=ws,
        dialect=dialect,
        # The front tells an interactive viewer's input from its update requests (idle timeout).
        backend=backend if view_only else InputWatch(backend),
        exclusive=relayed is None and not view_only,
        preserve=preserve,
        mode=mode,
        owner=relayed is None,
    )
