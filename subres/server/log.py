"""`GET …/{resource}/{name}/log`: a kept console's output as text, as `pods/log` answers.

RBAC `get machines/log` (view-level: reading, never typing). The options
are `pods/log`'s (`protocol.consolelog`): `tailLines`, `sinceSeconds` or
`sinceTime`, `limitBytes`, `timestamps` (the keeper's clock when each line's
first byte arrived), `previous` (the connection before the console was last
dialed again) and `follow`, which keeps the answer open over plain chunked
HTTP (no upgrade, so it passes kube-apiserver's proxy as `kubectl logs -f`
does) and sends new output as it arrives, across redials, until the console
is let go, the reader falls more than `session.observerBacklog` behind, or
the server drains. `console` picks one of the machine's consoles.

Only a kept console has a log: the keeper's scrollback is what is read. A
console that is not kept is a 400 saying how to keep it; one kept by
another replica a 503.
"""

from __future__ import annotations

import time

from aiohttp import web

from subres.kube.status import StatusError
from subres.protocol import consolelog
from subres.server import sharing, subresource
from subres.server.state import State
from subres.server.subresource import Target
from subres.sessions.follower import Follower
from subres.sessions.hub import Hub

__all__ = ["handle"]

TEXT = "text/plain; charset=utf-8"


async def handle(state: State, request: web.Request) -> web.StreamResponse:
    """The log, whole or followed."""
    try:
        options = consolelog.parse(request.query, now_ns=time.time_ns())
    except consolelog.OptionError as exc:
        raise StatusError(400, str(exc)) from None
    target = subresource.console(subresource.resolve(state, request, "console"), options.console)
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
    # Taken with the excerpt, before anything awaits: no output falls between the two.
    follower = _follow(state, request, hub)
    try:
        response = web.StreamResponse(headers={"Content-Type": TEXT})
        response.enable_chunked_encoding()
        await response.prepare(request)
        await response.write(body)
        while not stamper.done and (batch := await follower.next()) is not None:
            text = b"".join(stamper.feed(chunk, at) for chunk, at in batch)
            if text:
                await response.write(text)
        await response.write_eof()
        return response
    finally:
        hub.remove_sink(follower)
        state.sessions.end(None, follower)


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
    hub = state.sessions.hubs.get(sharing.key(target))
    if hub is not None and hub.keeper is not None and hub.scrollback is not None:
        return hub
    if state.sessions.active(sharing.keeper_key(target)):
        raise StatusError(
            503, f"{target.describe()}: another replica keeps this console; try again"
        )
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
    if spec.opted_in(spec.keep, target.obj, consoles.keep_annotation):
        raise StatusError(
            503,
            f"{target.describe()}: the console is to be kept but is not yet "
            f"(at most consoles.maxKept={consoles.max_kept} are kept); try again",
        )
    command = (
        f"kubectl annotate {parent.crd_resource}.{parent.group} {target.name} "
        f"-n {target.namespace} {consoles.keep_annotation}=true"
    )
    raise StatusError(
        400,
        f"{target.describe()}: the console is not kept, so it has no log; keep it with the "
        f'annotation {consoles.keep_annotation}="true" ({command})',
    )
