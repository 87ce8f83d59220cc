"""`GET …/{resource}/{name}/log`: a kept console's output as text, as `pods/log` answers.

RBAC `get machines/log` (view-level: reading, never typing). The options
are `pods/log`'s (`protocol.consolelog`): `tailLines`, `sinceSeconds` or
`sinceTime`, `limitBytes`, `timestamps` (the keeper's clock when each line's
first byte arrived), `previous` (the connection before the console was last
dialed again) and `follow`, which keeps the answer open over plain chunked
HTTP (no upgrade, so it passes kube-apiserver's proxy as `kubectl logs -f`
does) and sends new output as it arrives, across redials, until the console
is let go, the reader falls more than `session.observerBacklog` behind, or
the server drains. A follower holds an observer's place (429 past the
observer caps, before anything is attached), and what waits for it counts
what it was handed and has not sent yet. `console` picks one of the
machine's consoles.

Only a kept console has a log: the keeper's scrollback is what is read, on
the replica that owns the console (`sessions.members`). Any other replica
streams the owner's answer through (`owned`, the peer port's
`GET /peer/v1/log/…`). A console that is not kept is a 400 saying how to
keep it.
"""

from __future__ import annotations

import time
from urllib.parse import quote

from aiohttp import web

from subres.backends.agent import status_message
from subres.kube.status import StatusError
from subres.protocol import consolelog
from subres.server import subresource
from subres.server.state import State
from subres.sessions import keeper, sharing
from subres.sessions.follower import Follower
from subres.sessions.hub import Hub
from subres.sessions.peer import NOT_OWNER
from subres.sessions.target import Target, key

__all__ = ["handle", "owned"]

TEXT = "text/plain; charset=utf-8"
MAX_REFUSAL = 64 << 10
"""The largest refusal (a Status) read from the owner."""
PIECE = 64 << 10
"""The most of a follower's text handed to its connection at once."""


async def handle(state: State, request: web.Request) -> web.StreamResponse:
    """The log, here or from the console's owner."""
    options, target = _asked(state, request)
    owner = state.owners.owner(key(target))
    if owner is None:
        raise StatusError(503, f"no replica serves the {key(target)} yet; try again shortly")
    if owner == state.replica:
        return await _answer(state, request, target, options)
    if not options.follow or options.previous:
        return await _relayed(state, request, target, owner)
    # Relaying a follower holds its answer's buffers here too: it counts here as well.
    place = sharing.watching(state, target)
    try:
        return await _relayed(state, request, target, owner)
    finally:
        place.release()


async def owned(state: State, request: web.Request) -> web.StreamResponse:
    """The log of a console this replica owns, asked by another replica (421 if it does not)."""
    options, target = _asked(state, request)
    if not state.owners.mine(key(target)):
        raise StatusError(NOT_OWNER, f"the replica {state.replica} does not own the {key(target)}")
    return await _answer(state, request, target, options)


def _asked(state: State, request: web.Request) -> tuple[consolelog.LogOptions, Target]:
    try:
        options = consolelog.parse(request.query, now_ns=time.time_ns())
    except consolelog.OptionError as exc:
        raise StatusError(400, str(exc)) from None
    target = subresource.resolve(state, request, "console")
    return options, subresource.console(target, options.console)


async def _relayed(
    state: State, request: web.Request, target: Target, owner: str
) -> web.StreamResponse:
    """The owner's answer, passed on as it comes."""
    address = state.owners.addresses.get(owner)
    if address is None:
        raise StatusError(503, f"the replica {owner} owning the {key(target)} has no address")
    names = "/".join(
        quote(p, safe="") for p in (target.parent.resource, target.namespace, target.name)
    )
    path = f"/peer/v1/log/{names}" + (f"?{request.query_string}" if request.query_string else "")
    response = web.StreamResponse(headers={"Content-Type": TEXT})
    try:
        async with state.peers.opened(address, path) as answer:
            if answer.status != 200:
                body = await answer.content.read(MAX_REFUSAL)
                raise _refusal(owner, answer.status, body, answer.headers.get("Retry-After"))
            response.enable_chunked_encoding()
            await response.prepare(request)
            async for chunk in answer.content.iter_any():
                await response.write(chunk)
    except OSError as exc:
        if not response.prepared:
            where = f"the replica {owner}, which owns this console"
            raise StatusError(503, f"cannot reach {where}: {exc}") from None
        # Lost mid-answer: the log ends here, as a kubelet's does when its container goes.
    await response.write_eof()
    return response


def _refusal(owner: str, status: int, body: bytes, retry_after: str | None) -> StatusError:
    """The owner's refusal as this replica's: its code (503 for "not the owner"), message and,
    for a 429, when to try again."""
    code = 503 if status == NOT_OWNER else status
    message = status_message(body) or f"{owner} answered {status}"
    seconds = retry_after or ""
    if code != 429 or not (seconds.isascii() and seconds.isdigit() and len(seconds) < 6):
        return StatusError(code, message)
    return StatusError(
        code,
        message,
        details={"retryAfterSeconds": int(seconds)},
        headers=[("Retry-After", seconds)],
    )


async def _answer(
    state: State, request: web.Request, target: Target, options: consolelog.LogOptions
) -> web.StreamResponse:
    """The log from this replica's keeper: whole, or followed."""
    hub = _kept(state, target)
    assert hub.scrollback is not None
    excerpt = hub.scrollback.excerpt(previous=options.previous)
    if excerpt is None:
        raise StatusError(
            400, f"{target.describe()}: the console has had no previous connection to show"
        )
    body = consolelog.render(excerpt, options)
    if not options.follow or options.previous:
        return web.Response(body=body, headers={"Content-Type": TEXT})
    stamper = consolelog.Stamper(
        options, sent=len(body), line_start=excerpt.data.endswith(b"\n") or not excerpt.data
    )
    if stamper.done:
        return web.Response(body=body, headers={"Content-Type": TEXT})
    # A follower costs what an observer does, and counts as one: 429 past the caps.
    place = sharing.watching(state, target)
    # Taken with the excerpt, before anything awaits: no output falls between the two.
    follower = _follow(state, request, hub)
    try:
        response = web.StreamResponse(headers={"Content-Type": TEXT})
        response.enable_chunked_encoding()
        await response.prepare(request)
        await response.write(body)
        await _stream(response, follower, stamper)
        await response.write_eof()
        return response
    finally:
        hub.remove_sink(follower)
        state.sessions.end(None, follower)
        place.release()


async def _stream(
    response: web.StreamResponse, follower: Follower, stamper: consolelog.Stamper
) -> None:
    """New output as it arrives, until following ends; a reader cut off for falling behind
    reads why in a last line, as the log's own."""
    while not stamper.done:
        batch = await follower.next()
        if batch is None:
            if follower.cut_off:
                note = f"\n[subres: the log is cut off: it {follower.reason}]\n"
                await response.write(stamper.feed(note.encode(), time.time_ns()))
            return
        text = b"".join(stamper.feed(chunk, at) for chunk, at in batch)
        del batch  # the text alone is left to send (and counted until `sent`)
        view = memoryview(text)
        for start in range(0, len(view), PIECE):
            # In pieces: a reader that stops reading leaves one in the socket's buffer.
            await response.write(view[start : start + PIECE])
        follower.sent()


def _follow(state: State, request: web.Request, hub: Hub) -> Follower:
    transport = request.transport
    follower = Follower(
        limit=state.config.session.observer_backlog,
        abort=lambda: transport.abort() if transport is not None else None,
    )
    hub.add_sink(follower)
    state.sessions.start(None, follower)
    return follower


def _kept(state: State, target: Target) -> Hub:
    """The hub of `target`'s kept console (400 when it is not kept, saying how to keep it)."""
    hub = state.sessions.hubs.get(key(target))
    if hub is not None and hub.keeper is not None and hub.scrollback is not None:
        return hub
    spec, parent = target.spec, target.parent
    consoles = state.config.consoles
    if spec.keep == "never":
        how = (
            f"{parent.resource} never keep their console (console.keep: never "
            "in subres's configuration)"
        )
        raise StatusError(
            400, f"{target.describe()}: the console is not kept, so it has no log; {how}"
        )
    opted_in = spec.opted_in(spec.keep, target.obj, consoles.keep_annotation)
    if opted_in and not keeper.dialable(target):
        raise StatusError(
            400,
            f"{target.describe()}: the console is not kept, so it has no log: it names no "
            f"endpoint to dial ({spec.endpoint})",
        )
    if opted_in:
        raise StatusError(
            503,
            f"{target.describe()}: the console is to be kept but is not yet "
            f"(at most consoles.maxKept={consoles.max_kept} are kept); try again",
        )
    raise StatusError(
        400,
        f"{target.describe()}: the console is not kept, so it has no log; keep it with the "
        f'annotation {consoles.keep_annotation}="true" ({_how_to_annotate(state, target)})',
    )


def _how_to_annotate(state: State, target: Target) -> str:
    """How the user adds the keep annotation: where the object lives decides."""
    annotation = state.config.consoles.keep_annotation
    if state.parents_file is not None:
        return f"in {state.parents_file}, under its metadata.annotations; subres re-reads the file"
    parent = target.parent
    return (
        f"kubectl annotate {parent.crd_resource}.{parent.group} {target.name} "
        f"-n {target.namespace} {annotation}=true"
    )
