"""`…/{resource}/{name}/console` and `…/console-observe`: the serial console, shared.

Over a WebSocket in any channel dialect, or SPDY remote-command. `console`
is the writer: one per machine, a newer one takes over. `console-observe`
is an observer: read-only, authorized as its own subresource so that RBAC
can grant watching without typing, at most `session.maxObserversPerConsole`
per console and `session.maxObservers` per replica (429 beyond:
`sessions.sharing`); observers stay attached while writers come and go.
`console-moderate` is an observer whom a moderated writer waits for
(`sessions.moderation`). All accept `?tail=N` (lines of a kept console's
scrollback to replay first) and `?console=NAME`: which of the machine's
consoles (`serial1`, `sol`…), each with its own writer, observers, keeper,
scrollback and recording; none (what virtctl and every other client send)
is the default one. The console's owner (`sessions.members`) holds the
writer's slot, the observers and the kept connection; when that is another
replica, this one relays to it (`sessions.peer`).
"""

from __future__ import annotations

from aiohttp import hdrs, web

from subres.backends.peer import PeerStream
from subres.engine.stream import ByteStream
from subres.kube import status
from subres.kube.status import StatusError
from subres.protocol import digits, httpstream
from subres.server import handshake, remotecommand, streaming, subresource
from subres.server.middleware import who
from subres.server.state import State
from subres.sessions import peer, sharing
from subres.sessions.modes import Mode

__all__ = ["SUBPROTOCOLS", "handle", "observe"]

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
MAX_TAIL = (1 << 31) - 1
"""The most lines `?tail=` may ask for (more than any scrollback holds)."""
_NOTHING_TO_TAIL = (
    "the console of {} is not kept, so it has no scrollback: tail is ignored "
    "(a console is kept when its parent opts in, e.g. subres.dev/keep-console)"
)


async def handle(state: State, request: web.Request) -> web.StreamResponse:
    """The writer: check, negotiate, dial, then upgrade and stream."""
    return await _serve(state, request, mode=Mode.WRITER)


async def observe(state: State, request: web.Request) -> web.StreamResponse:
    """An observer: check, negotiate, attach to the console, then upgrade and stream."""
    return await _serve(state, request, mode=Mode.OBSERVER)


async def moderate(state: State, request: web.Request) -> web.StreamResponse:
    """A moderator: an observer whom a moderated writer waits for (`sessions.moderation`)."""
    return await _serve(state, request, mode=Mode.MODERATOR)


async def _serve(state: State, request: web.Request, *, mode: Mode) -> web.StreamResponse:
    target = subresource.console(
        subresource.resolve(state, request, "console"), request.query.get("console")
    )
    url = subresource.endpoint_url(target)
    tail = _tail(request)
    if handshake.dry_run(request):  # what the page asks when a browser hid a refusal
        if mode == Mode.WRITER:
            await subresource.vet(state, target, url)
        return handshake.dry_run_passed()
    # The two dialects' upgrades take different arguments: two calls that look alike.
    if httpstream.is_spdy_upgrade(
        request.headers.getall(hdrs.CONNECTION, []), request.headers.getall(hdrs.UPGRADE, [])
    ):
        protocol = remotecommand.negotiate(request)
        backend, relayed = await _backend(state, request, target, url, mode=mode, tail=tail)
        return await remotecommand.serve(
            state,
            request,
            target=target,
            protocol=protocol,
            backend=backend,
            exclusive=not relayed and mode == Mode.WRITER,
            owner=not relayed,
            mode=mode,
        )
    ws, dialect = streaming.negotiate(state, request, "console", SUBPROTOCOLS)
    backend, relayed = await _backend(state, request, target, url, mode=mode, tail=tail)
    if tail and not _replays(state, target, backend):
        # Said, not refused: the session is what was asked for, less a replay. A tail of
        # 0 (what a piped `subres console` asks) gets just what it asked for: nothing.
        ws.headers.append(
            (hdrs.WARNING, status.warning(_NOTHING_TO_TAIL.format(target.describe())))
        )
    return await streaming.serve(
        state,
        request,
        target=target,
        ws=ws,
        dialect=dialect,
        backend=backend,
        exclusive=not relayed and mode == Mode.WRITER,
        owner=not relayed,
        mode=mode,
    )


async def _backend(
    state: State,
    request: web.Request,
    target: subresource.Target,
    url: str,
    *,
    mode: Mode,
    tail: int | None,
) -> tuple[ByteStream, bool]:
    """The session's backend, and whether it is relayed to another replica.

    When another replica owns the console, a peer session there (which holds
    the slot and records); else the console here.
    """
    if mode == Mode.MODERATOR:
        sharing.may_moderate(state, target, who(request))  # before asking the owner
    relayed = await peer.front(state, target, who(request), mode=mode, preserve=False, tail=tail)
    if relayed is not None:
        return relayed, True
    return await sharing.console(state, target, who(request), mode=mode, tail=tail), False


def _replays(state: State, target: subresource.Target, backend: ByteStream) -> bool:
    """Whether the console is kept, here or by its owner, with a scrollback to replay."""
    if isinstance(backend, PeerStream):
        return backend.keeps_scrollback
    return sharing.keeps_scrollback(state, target)


def _tail(request: web.Request) -> int | None:
    text = request.query.get("tail")
    if text is None:
        return None
    if not digits.plain(text):
        raise StatusError(400, f"tail must be a number of lines, not {text[:64]!r}")
    lines = digits.value(text, cap=MAX_TAIL)
    if lines > MAX_TAIL:
        raise StatusError(400, f"tail must be at most {MAX_TAIL} lines")
    return lines
