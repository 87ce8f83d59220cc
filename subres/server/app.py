"""The aiohttp application: the route table and what runs around it.

Routes are declared in one table; every handler takes the `State` first.
Every request passes `errors.errors` (any failure becomes a `Status`)
and `middleware.identity` (authenticate 401, authorize 403) before its
handler. Then, for `…/{resource}/{name}/SUB` (ROUTE: handler; checks before any
upgrade, each a Status; the live part):

- console, WebSocket: `console.handle`; `subresource.resolve` (404, 409 for the
  state rules, 503 while the cache syncs), `endpoint_url` (400),
  `streaming.negotiate` (400, 426), `subresource.connect` (403 by the endpoint
  policy, 503 when the dial fails); `streaming.serve`: `WebSocketClient` and
  the pump.
- console, SPDY/3.1: `remotecommand.handle`; the same, with
  `httpstream.negotiate` (403 listing what is accepted); a
  `RemoteCommandClient` over an `engine.spdy` session, and the pump.
- vnc: `vnc.handle`; as console, and `preserveSession` is 409 while another
  session lives; `streaming.serve`.
- screenshot (also KubeVirt's `vnc/screenshot`, authorized as `vnc`):
  `screenshot.handle`; as vnc; `backends.rfb.capture`, then PNG.
- portforward `?ports=`: `portforward_ws.handle_channels`; ports (400), each
  allowed (403) and vetted; a `ChannelMux`, each port dialed after the
  upgrade and pumped.
- portforward, SPDY/3.1 or tunnelled: `portforward_spdy.handle_spdy` /
  `handle_tunnel`; resolve, protocol (403); an `engine.spdy` session, each
  error/data pair checked, dialed and pumped (failures are text on its error
  stream).
- portforward/{port}[/{tcp|udp}]: `portforward_ws.handle_port`; port (400),
  allowed (403), `subresource.connect`; a `RawWebSocket` and the pump.
- log: `log.handle`; options (400), resolve as console, kept here (400 not kept,
  503 kept elsewhere); the scrollback as text, then with `follow` chunked HTTP
  from a `sessions.follower.Follower`.
- usbredir: `usbredir.handle`; as vnc, on the first free USB slot (or the one
  held longest, taken over; 409 with `preserveSession`); `streaming.serve`.

Every live part runs inside `session.live` (register, takeover, count, one
log line, the `Record` of how it ended) and stops when either side is gone.
Backends are `engine.sockets.SocketStream` (tcp, unix),
`backends.datagram.DatagramStream` (udp) or an SSH channel of
`backends.ssh.Pool` (`ssh://` consoles, forwards through a jump host), vetted
by `backends.endpoint`. `/apis/{group}/{version}/version` is the version
document KubeVirt's clients read (`server_version`).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable

from aiohttp import web

from subres.server import (
    console,
    log,
    middleware,
    moderate,
    portforward,
    recordinglist,
    screenshot,
    sessionlist,
    usbredir,
    vnc,
)
from subres.server.discovery import AGGREGATED_TYPES, wants_aggregated
from subres.server.state import State
from subres.serving import errors, health
from subres.sessions.keeper import Keeper
from subres.web import page

__all__ = ["KEEPER", "build"]

KEEPER = web.AppKey("keeper", Keeper)
"""The application's console keeper."""

Handler = Callable[[State, web.Request], Awaitable[web.StreamResponse]]


def build(state: State) -> web.Application:
    """The application serving `state`."""
    app = state.connections.application(
        [errors.errors, middleware.identity(state)],
        authenticated=middleware.authenticated,
        client_max_size=1 << 20,
        handler_args={"max_field_size": 16384},
    )
    group, version = state.config.group, state.config.version
    namespaced = f"/apis/{group}/{version}/namespaces/{{namespace}}"
    sub = f"{namespaced}/{{resource}}/{{name}}"
    table: list[tuple[str, str, Handler]] = [
        ("GET", "/apis", apis),
        ("GET", f"/apis/{group}", api_group),
        ("GET", f"/apis/{group}/{version}", api_resources),
        ("GET", f"/apis/{group}/{version}/version", server_version),
        ("GET", "/openapi/v2", openapi_v2),
        ("GET", "/openapi/v3", openapi_v3_index),
        ("GET", f"/openapi/v3/apis/{group}/{version}", openapi_v3),
        ("GET", "/metrics", metrics),
        ("GET", f"{sub}/console", console.handle),
        ("POST", f"{sub}/console", console.handle),
        ("GET", f"{sub}/console-observe", console.observe),
        ("POST", f"{sub}/console-observe", console.observe),
        ("GET", f"{sub}/console-moderate", console.moderate),
        ("POST", f"{sub}/console-moderate", console.moderate),
        ("DELETE", f"{sub}/console-moderate", moderate.end),
        ("GET", f"{sub}/sessions", sessionlist.for_machine),
        ("GET", f"{sub}/log", log.handle),
        ("GET", f"{sub}/recordings", recordinglist.listing),
        ("GET", f"{sub}/recordings/{{file}}", recordinglist.one),
        ("GET", f"{namespaced}/sessions", sessionlist.for_namespace),
        ("GET", f"/apis/{group}/{version}/sessions", sessionlist.for_namespace),
        ("GET", f"{sub}/vnc", vnc.handle),
        ("GET", f"{sub}/vnc-observe", vnc.observe),
        ("GET", f"{sub}/vnc-moderate", vnc.moderate),
        ("DELETE", f"{sub}/vnc-moderate", moderate.end),
        ("GET", f"{sub}/screenshot", screenshot.handle),
        # KubeVirt's path (`virtctl vnc screenshot`); authorized as `vnc`, as kube-apiserver does.
        ("GET", f"{sub}/vnc/screenshot", screenshot.handle),
        ("GET", f"{sub}/portforward", portforward.handle),
        ("POST", f"{sub}/portforward", portforward.handle),
        ("GET", f"{sub}/portforward/{{port}}", portforward.handle_port),
        ("GET", f"{sub}/portforward/{{port}}/{{protocol}}", portforward.handle_port),
        ("GET", f"{sub}/usbredir", usbredir.handle),
    ]
    for method, path, handler in table:
        app.router.add_route(method, path, functools.partial(handler, state))
    _health_routes(app, state)
    # The browser page; anonymous users reach it only where `/ui/*` is an always-allowed path.
    parent = state.config.parents[0]
    settings = page.PageSettings(
        api_prefix=f"/apis/{group}/{version}",
        resource=parent.resource,
        types=(parent.resource, parent.singular),
    )
    page.add_routes(app, settings)

    keeper = app[KEEPER] = Keeper(state)
    state.metrics.replica_members.set(len(state.owners.members))

    def members_changed(_: tuple[str, ...]) -> None:
        state.metrics.replica_members.set(len(state.owners.members))
        state.sessions.moved(state.owners.mine, "the session moved to another replica")

    state.owners.on_change(members_changed)

    async def on_startup(_: web.Application) -> None:
        await state.recordings.start()
        await keeper.start()
        if state.audit.sink is not None:
            await state.audit.sink.start()

    async def on_shutdown(_: web.Application) -> None:
        # Live sessions were ended before this (`run.Server.stop`); then the kept consoles
        # and the SSH connections go.
        await keeper.stop()
        await state.ssh.close()

    async def on_cleanup(_: web.Application) -> None:
        await state.recordings.stop()
        await state.events.close()
        await asyncio.to_thread(state.audit.close)
        if state.audit.sink is not None:  # after the lines it still had were spooled
            await state.audit.sink.close()

    app.on_startup.append(on_startup)
    app.on_shutdown.append(on_shutdown)
    # Every answer, errors and upgrades included, as its headers go out.
    app.on_response_prepare.append(state.metrics.answered)
    app.on_cleanup.append(on_cleanup)
    return app


def _health_routes(app: web.Application, state: State) -> None:
    ping = {"ping": lambda: True}
    ready = {
        **ping,
        "tls-certificates": lambda: state.tls_ready,
        "parent-caches": lambda: all(c.synced for c in state.caches.values()),
        **state.readiness,
    }
    # As kube-apiserver's: a draining server is alive and healthy, not ready.
    draining = {"shutdown": lambda: not state.draining}
    for endpoint, checks in (
        ("healthz", ready),
        ("livez", ping),
        ("readyz", {**ready, **draining}),
    ):
        handle = health.handler(endpoint, checks)
        app.router.add_get(f"/{endpoint}", handle)
        app.router.add_get(f"/{endpoint}/{{check}}", handle)


def _json(body: bytes, **headers: str) -> web.Response:
    return web.Response(body=body, content_type="application/json", headers=headers)


async def apis(state: State, request: web.Request) -> web.Response:
    """`/apis`: aggregated discovery when asked for it, APIGroupList otherwise."""
    version = wants_aggregated(request.headers.get("Accept", ""))
    if version is None:
        return _json(state.discovery.group_list, Vary="Accept")
    doc = state.discovery.aggregated[version]
    headers = {"ETag": doc.etag, "Vary": "Accept"}
    if request.headers.get("If-None-Match") == doc.etag:
        return web.Response(status=304, headers=headers)
    return web.Response(
        body=doc.data, headers={**headers, "Content-Type": AGGREGATED_TYPES[version]}
    )


async def api_group(state: State, request: web.Request) -> web.Response:
    """`/apis/{group}`: APIGroup."""
    return _json(state.discovery.group)


async def api_resources(state: State, request: web.Request) -> web.Response:
    """`/apis/{group}/{version}`: APIResourceList (also kube-aggregator's availability probe)."""
    return _json(state.discovery.resource_list)


async def server_version(state: State, request: web.Request) -> web.Response:
    """`/apis/{group}/{version}/version`: what `virtctl version` and its error path read."""
    return _json(state.discovery.version)


async def openapi_v2(state: State, request: web.Request) -> web.Response:
    """`/openapi/v2` with ETag and 304."""
    spec = state.openapi
    if request.headers.get("If-None-Match") == spec.v2_etag:
        return web.Response(status=304, headers={"ETag": spec.v2_etag})
    return _json(spec.v2, ETag=spec.v2_etag)


async def openapi_v3_index(state: State, request: web.Request) -> web.Response:
    """`/openapi/v3`: where each group-version document lives, by hash."""
    return _json(state.openapi.v3_index())


async def openapi_v3(state: State, request: web.Request) -> web.Response:
    """The group-version document; immutable under its own hash, plain under any other.

    kube-openapi redirects an old hash to the current one (301). subres never
    redirects: kube-apiserver turns an aggregated server's redirect into a 502
    (`--aggregator-reject-forwarding-redirect`, the fix of CVE-2022-3172), and
    during a rolling update its index may name a hash one replica no longer
    has. Under a hash that is not its own, the document is served uncacheable.
    """
    spec = state.openapi
    cache = (
        "public, immutable" if request.query.get("hash") == spec.v3_hash else "no-cache, private"
    )
    return _json(spec.v3, ETag=f'"{spec.v3_hash}"', **{"Cache-Control": cache})


async def metrics(state: State, request: web.Request) -> web.StreamResponse:
    """`/metrics`."""
    return await state.metrics.handle(request)
