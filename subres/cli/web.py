"""`subres web`: the browser page on a local port, its WebSockets forwarded with our credentials.

Owns the verb's flags, the local HTTP server and the credential-adding relay.
The page (from `subres.web`) talks only to its own origin; this process opens
the matching WebSocket to the cluster with the kubeconfig's credentials, so
the browser never sees a token. Only the page opened from the link this
process prints may drive the relay. The link carries a key made at launch
(in its fragment, which no server or log sees); the page sends it on every
relayed request, and a request without it is refused (401) whatever its
headers say: any local process can send `Origin: http://127.0.0.1:PORT`, only
the user who ran `subres web` has the key. Browsers add two more checks: every
request must name this server by `localhost` or an IP literal (a DNS-rebound
name would carry an attacker's origin), and every WebSocket must come from
the same origin. Only these pass, of the configured group-version: the
console and vnc WebSockets and their read-only shares (`console-observe`,
`vnc-observe`); the page's plain GETs of who holds the machine (`sessions`)
and of its recordings (`recordings`, `recordings/FILE`); and a plain GET of
a console or display, which the server answers with the Status its checks
give (no dial), for the page to say why a connection was refused. A browser
hides a refused upgrade's answer from the page, but this relay read it: the
refusal of a console or display is kept (`_Refusals`) and is what the page's
GET that follows gets, so the page says what the CLI says, a backend's
refusal included, which no check without a dial could tell.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import hmac
import ipaddress
import json
import logging
import secrets
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from urllib.parse import quote, urlsplit

from aiohttp import WSMsgType, web
from websockets.exceptions import ConnectionClosed

from subres.cli import api, kubeconfig, terminal
from subres.cli.api import CommandError, ServerError
from subres.cli.kubeconfig import ClientConfig
from subres.engine.pump import Traffic, pump
from subres.engine.wsclient import ClientWebSocket
from subres.protocol import channels
from subres.web import page

__all__ = ["build", "main", "new_key", "page_url", "same_origin", "serve"]

log = logging.getLogger(__name__)

SUBRESOURCES = ("console", "console-observe", "vnc", "vnc-observe")
READS = ("sessions", "recordings")
"""What the page reads with a plain GET: who holds the machine, its recordings."""
RECORDING = "application/x-asciicast"
MAX_READ = 16 << 20
KEY_BYTES = 32
MAX_MESSAGE = 4 * 1024 * 1024
CLOSE_TIMEOUT = 10.0
REFUSAL_TTL = 30.0
"""Seconds a refused upgrade's Status waits for the page to ask why."""
MAX_REFUSALS = 64
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@api.command
def main(ns: argparse.Namespace) -> int:
    """Serve the page until interrupted."""
    typed = api.parse_target(ns.target) if ns.target else None
    config = kubeconfig.from_args(ns)
    if not page.assets_built():
        raise CommandError("the page's scripts are missing: reinstall subres")
    return asyncio.run(_web(config, typed, ns))


async def _web(config: ClientConfig, typed: api.TargetText | None, ns: argparse.Namespace) -> int:
    target = None
    if typed is not None:
        target = await api.resolve(
            typed, config, group_version=ns.api_group_version, namespace_flag=ns.namespace
        )
    settings = page.PageSettings(
        api_prefix=f"/apis/{ns.api_group_version}",
        resource=target.resource if target else api.DEFAULT_TYPES[0],
        types=(target.resource, target.kind) if target else api.DEFAULT_TYPES,
        namespace=config.namespace,
        machine=f"{target.namespace}/{target.name}" if target else "",
    )
    key = new_key()
    try:
        return await _serve(build(config, settings, key=key), ns.address, ns.port, settings, key)
    except OSError as exc:
        hint = "; pass --port (0 picks a free one)" if exc.errno == errno.EADDRINUSE else ""
        raise CommandError(
            f"cannot listen on {ns.address}:{ns.port}: {api.os_reason(exc)}{hint}"
        ) from None


def new_key() -> str:
    """A key for one launch of the relay: 256 random bits, URL-safe."""
    return secrets.token_urlsafe(KEY_BYTES)


def page_url(address: str, port: int, settings: page.PageSettings, key: str) -> str:
    """The link that opens the page: the machine in the query, the key in the fragment."""
    host = f"[{address}]" if ":" in address else address
    query = f"?machine={settings.machine}" if settings.machine else ""
    return f"http://{host}:{port}{page.PREFIX}/{query}#token={key}"


def build(config: ClientConfig, settings: page.PageSettings, *, key: str) -> web.Application:
    """The local application: the page, and the relay for its requests that carry `key`."""
    app = web.Application(middlewares=[_named_by_address])
    page.add_routes(app, settings)
    app.router.add_get("/", _to_page)
    sub = f"{settings.api_prefix}/namespaces/{{namespace}}/{{resource}}/{{name}}/{{sub}}"
    live: set[web.WebSocketResponse] = set()
    refusals = _Refusals()

    async def relay(request: web.Request) -> web.StreamResponse:
        _check_key(request, key)
        if "Upgrade" not in request.headers:
            return await _read(config, settings.api_prefix, request, refusals)
        return await _relay(config, settings.api_prefix, request, live, refusals)

    async def close_live(_: web.Application) -> None:
        # Open sessions would otherwise hold the shutdown until the browser lets go.
        for ws in list(live):
            await ws.close(code=1001, message=b"subres web is stopping")

    async def read(request: web.Request) -> web.StreamResponse:
        _check_key(request, key)
        return await _read(config, settings.api_prefix, request, refusals)

    app.router.add_get(sub, relay)
    app.router.add_get(f"{sub}/{{file}}", read)
    app.on_shutdown.append(close_live)
    return app


async def serve(app: web.Application, address: str, port: int) -> web.AppRunner:
    """Start `app` on `address:port` (0: any free port); the caller cleans the runner up."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, address, port).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner


async def _serve(
    app: web.Application, address: str, port: int, settings: page.PageSettings, key: str
) -> int:
    runner = await serve(app, address, port)
    try:
        url = page_url(address, runner.addresses[0][1], settings, key)
        print(f"Serving the subres page at {url}", flush=True)
        if not _loopback(address):
            print(
                "warning: whoever reaches this address and has the link acts with your credentials",
                file=sys.stderr,
            )
        stop = asyncio.Event()
        with terminal.on_signals((signal.SIGINT, signal.SIGTERM), stop.set):
            await stop.wait()
    finally:
        await runner.cleanup()
    return 0


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


async def _to_page(request: web.Request) -> web.StreamResponse:
    raise web.HTTPFound(request.rel_url.with_path(f"{page.PREFIX}/").with_query(request.query))


@web.middleware
async def _named_by_address(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuse requests for any other host name: they are DNS rebinding, not our page."""
    if not _local_host(request):
        raise web.HTTPForbidden(text="this server answers only to localhost or an IP address\n")
    return await handler(request)


def _local_host(request: web.Request) -> bool:
    parts = urlsplit(f"//{request.host}")
    try:
        port = parts.port
    except ValueError:
        return False
    sockname = request.transport.get_extra_info("sockname") if request.transport else None
    if sockname is None or (port or 80) != sockname[1]:
        return False
    if parts.hostname == "localhost":
        return True
    try:
        ipaddress.ip_address(parts.hostname or "")
    except ValueError:
        return False
    return True


def _check_key(request: web.Request, key: str) -> None:
    """Refuse (401) a request that does not carry this launch's key.

    The page sends it as a bearer token: an `Authorization` header on its
    reads, the bearer subprotocol on its WebSockets (browsers let a page set
    no header there).
    """
    offered = _protocols(request)
    given = [channels.bearer_token(offered) or ""]
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer":
        given.append(value.strip())
    if not any(hmac.compare_digest(g.encode(), key.encode()) for g in given if g):
        status = {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "code": 401,
            "reason": "Unauthorized",
            "message": "this page needs the key in the link subres printed: open that link",
        }
        raise web.HTTPUnauthorized(text=json.dumps(status), content_type="application/json")


def same_origin(request: web.Request) -> bool:
    """True when the request's Origin is the page's own (`http://` and the Host it asked)."""
    return request.headers.get("Origin") == f"http://{request.host}"


class _Refusals:
    """The last refused upgrade of each console or display, until the page asks why."""

    def __init__(self) -> None:
        self._kept: dict[tuple[str, ...], tuple[float, CommandError]] = {}

    def keep(self, request: web.Request, refusal: CommandError) -> None:
        if len(self._kept) >= MAX_REFUSALS:
            del self._kept[next(iter(self._kept))]  # the oldest: the page asks at once
        self._kept[self._key(request)] = (time.monotonic(), refusal)

    def take(self, request: web.Request) -> CommandError | None:
        """What refused this subresource lately; None if nothing did."""
        kept = self._kept.pop(self._key(request), None)
        if kept is None or time.monotonic() - kept[0] > REFUSAL_TTL:
            return None
        return kept[1]

    @staticmethod
    def _key(request: web.Request) -> tuple[str, ...]:
        # The page's GET is the upgrade's request plus ?dryRun=All.
        query = sorted(f"{k}={v}" for k, v in request.query.items() if k != "dryRun")
        names = ("namespace", "resource", "name", "sub")
        return (*(request.match_info[n] for n in names), *query)


def _status(exc: CommandError) -> web.Response:
    """A failure as the Status the page reads: the server's, or ours when none answered."""
    if not isinstance(exc, ServerError):
        body: dict[str, object] = {"kind": "Status", "status": "Failure", "message": str(exc)}
        return web.json_response({**body, "code": 502}, status=502)
    body = {"kind": "Status", "status": "Failure", "code": exc.code, "reason": exc.reason}
    return web.json_response({**body, "message": exc.message}, status=exc.code)


async def _relay(
    config: ClientConfig,
    api_prefix: str,
    request: web.Request,
    live: set[web.WebSocketResponse],
    refusals: _Refusals,
) -> web.StreamResponse:
    """Open the cluster's WebSocket with our credentials, then accept the page's and pump."""
    if not same_origin(request):
        log.warning("refused a WebSocket from origin %s", request.headers.get("Origin"))
        raise web.HTTPForbidden(text="cross-origin WebSocket refused\n")
    sub = request.match_info["sub"]
    if sub not in SUBRESOURCES:
        raise web.HTTPNotFound()
    try:
        upstream = await api.connect(
            config,
            _upstream_url(config, api_prefix, request),
            subprotocols=_offered(request),
            max_size=MAX_MESSAGE,
            close_timeout=CLOSE_TIMEOUT,
        )
    except CommandError as exc:
        code = exc.code if isinstance(exc, ServerError) else 502
        print(f"error: {request.match_info['name']} {sub}: {exc}", file=sys.stderr, flush=True)
        refusals.keep(request, exc)
        return web.Response(status=code, text=f"{exc}\n")
    chosen = upstream.subprotocol
    ws = web.WebSocketResponse(protocols=(chosen,) if chosen else (), max_msg_size=MAX_MESSAGE)
    live.add(ws)
    try:
        await ws.prepare(request)
        await _pump(ws, upstream)
    finally:
        live.discard(ws)
        await upstream.close()
    return ws


def _protocols(request: web.Request) -> list[str]:
    return [
        p.strip()
        for header in request.headers.getall("Sec-WebSocket-Protocol", [])
        for p in header.split(",")
        if p.strip()
    ]


def _offered(request: web.Request) -> list[str]:
    """The page's subprotocols; its bearer offer (our key) is dropped: the kubeconfig
    decides who we are upstream."""
    return channels.without_bearer(_protocols(request))


async def _read(
    config: ClientConfig, api_prefix: str, request: web.Request, refusals: _Refusals
) -> web.StreamResponse:
    """A plain GET of the page's (sessions, recordings), made with our credentials, streamed back;
    of a console or display that was just refused, the refusal.

    Only the page itself may ask: a browser says where a request comes from
    (`Sec-Fetch-Site`, `Origin`), and another site's requests are refused.
    """
    sub = request.match_info["sub"]
    site = request.headers.get("Sec-Fetch-Site", "same-origin")
    readable = sub in READS or ("file" not in request.match_info and sub in SUBRESOURCES)
    if not readable or (site != "same-origin" or not same_origin_or_none(request)):
        raise web.HTTPForbidden(text="only the page may read this\n")
    if sub in SUBRESOURCES and (refused := refusals.take(request)) is not None:
        return _status(refused)
    content_type = RECORDING if "file" in request.match_info else "application/json"
    response = web.StreamResponse(
        headers={"Content-Type": content_type, "Cache-Control": "no-store"}
    )

    async def forward(chunk: bytes) -> None:
        if not response.prepared:
            await response.prepare(request)
        await response.write(chunk)

    url = _upstream_url(config, api_prefix, request, websocket=False)
    try:
        await api.get(config, url, max_body=MAX_READ, sink=forward)
    except CommandError as exc:
        return _status(exc)
    if not response.prepared:
        await response.prepare(request)
    await response.write_eof()
    return response


def same_origin_or_none(request: web.Request) -> bool:
    """True without an Origin header (a same-origin GET), or with the page's own."""
    return "Origin" not in request.headers or same_origin(request)


def _upstream_url(
    config: ClientConfig, api_prefix: str, request: web.Request, *, websocket: bool = True
) -> str:
    """The same subresource on the cluster's server (query included)."""
    parts = urlsplit(config.server)
    scheme = ("wss" if parts.scheme == "https" else "ws") if websocket else parts.scheme
    keys = ("namespace", "resource", "name", "sub", "file")
    path = "/".join(
        quote(request.match_info[key], safe="") for key in keys if key in request.match_info
    )
    query = f"?{request.query_string}" if request.query_string else ""
    return f"{scheme}://{parts.netloc}{parts.path.rstrip('/')}{api_prefix}/namespaces/{path}{query}"


async def _pump(ws: web.WebSocketResponse, upstream: ClientWebSocket) -> None:
    """Copy both ways, message by message; the first side to end ends the other."""
    text = "base64" in (upstream.subprotocol or "")
    await pump(_Page(ws, text=text), _Cluster(upstream, text=text), Traffic(), grace=0)
    code = upstream.close_code if upstream.close_code not in (None, 1005, 1006) else 1000
    await ws.close(code=code, message=(upstream.close_reason or "").encode()[:120])


class _Page:
    """The page's WebSocket as the pump's client: one read, one message.

    Base64 channel subprotocols travel in text messages, the others in binary.
    """

    def __init__(self, ws: web.WebSocketResponse, *, text: bool) -> None:
        self._ws = ws
        self._text = text
        self._gone = False

    @property
    def gone(self) -> bool:
        return self._gone or self._ws.closed

    async def read(self) -> bytes:
        while not self.gone:
            message = await self._ws.receive()
            data: bytes
            if message.type is WSMsgType.TEXT:
                data = str(message.data).encode()
            elif message.type is WSMsgType.BINARY:
                data = bytes(message.data)
            else:
                break
            if data:
                return data
        self._gone = True
        return b""

    async def write(self, data: bytes) -> None:
        if self._text:
            await self._ws.send_str(data.decode(errors="replace"))
        else:
            await self._ws.send_bytes(data)

    async def write_eof(self) -> None:
        pass  # the page is closed with the cluster's close code once the pump is done

    async def abort(self, reason: str) -> None:
        self._gone = True

    async def close(self) -> None:
        pass


class _Cluster:
    """The cluster's WebSocket as the pump's backend: one read, one message."""

    def __init__(self, ws: ClientWebSocket, *, text: bool) -> None:
        self._ws = ws
        self._text = text

    async def read(self) -> bytes:
        while True:
            try:
                message = await self._ws.recv()
            except ConnectionClosed:
                return b""
            if data := message.encode() if isinstance(message, str) else message:
                return data

    async def write(self, data: bytes) -> None:
        try:
            await self._ws.send(data.decode(errors="replace") if self._text else data)
        except ConnectionClosed as exc:
            raise ConnectionResetError(str(exc)) from None

    async def write_eof(self) -> None:
        pass  # the page never half-closes

    async def close(self) -> None:
        await self._ws.close()
