"""Port-forward over plain WebSockets: kubelet's channel dialect and KubeVirt's raw one.

`handle_channels` serves `…/portforward?ports=…` (v4 binary, v4 base64, or
no subprotocol): every check that can fail before the upgrade answers with a
Status (bad ports 400, a port the parent does not allow 403, endpoint policy);
then one backend connection per port, a dial failure reported on that port's
error channel as kubelet does, and the WebSocket closed once every port ended.

`handle_port` serves `…/portforward/{port}[/{tcp|udp}]`: one raw WebSocket per
forwarded connection, dialed before the upgrade (503 on failure), half-close
both ways, and for UDP one datagram per message.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import Any

from aiohttp import hdrs, web

from subres.backends import datagram
from subres.backends import endpoint as endpoints
from subres.backends import stream as sockets
from subres.backends.stream import BackendUnavailable, ByteStream
from subres.kube.status import StatusError
from subres.protocol import channels
from subres.protocol import portforward_ws as wire
from subres.server import subresource
from subres.server.state import State
from subres.server.streaming import offered_subprotocols
from subres.server.subresource import Target
from subres.streams.forwarding import ChannelMux, PortChannel, RawWebSocket
from subres.streams.pump import Ending, pump
from subres.streams.sessions import Closable

__all__ = ["PROTOCOLS", "RAW_SUBPROTOCOLS", "handle_channels", "handle_port"]

log = logging.getLogger(__name__)

SUBRESOURCE = "portforward"
RAW_SUBPROTOCOLS = ("", "plain.kubevirt.io")
"""KubeVirt style: no subprotocol, or KubeVirt's."""
PROTOCOLS = ("tcp", "udp")


async def handle_channels(state: State, request: web.Request) -> web.StreamResponse:
    """Kubernetes style: every port of `?ports=` on one channel WebSocket."""
    target = subresource.resolve(state, request, SUBRESOURCE)
    try:
        ports = wire.parse_ports(request.query.getall("ports", []))
    except wire.PortsError as exc:
        raise StatusError(400, str(exc)) from None
    for port in ports:
        subresource.forward_url(target, port)
    dialect = wire.negotiate(offered_subprotocols(request))
    if dialect is None:
        supported = ", ".join(name for name in wire.DIALECTS if name)
        raise StatusError(400, f"unsupported subprotocols for portforward; supported: {supported}")
    ws = _response(state, request, dialect.name, autoclose=True)
    vetted = {port: await _vet(state, target, port) for port in set(ports)}
    await ws.prepare(request)
    mux = ChannelMux(ws, dialect, ports)
    await _tracked(state, target, mux, _forward_ports(state, target, mux, vetted))
    return ws


async def _forward_ports(
    state: State, target: Target, mux: ChannelMux, vetted: dict[int, endpoints.Target]
) -> Ending:
    await mux.hello()
    reader = asyncio.create_task(mux.receive())
    forwards = [
        asyncio.create_task(_forward_port(state, target, port, vetted[port.port]))
        for port in mux.ports
    ]
    try:
        endings = await asyncio.gather(*forwards)
    finally:
        for task in (reader, *forwards):
            task.cancel()
        await asyncio.wait([reader, *forwards])
        # kubelet closes the WebSocket (1000) once every port's forward returned.
        await mux.close()
    for ending in (Ending.ERROR, Ending.CLIENT):
        if ending in endings:
            return ending
    return Ending.BACKEND


async def _forward_port(
    state: State, target: Target, port: PortChannel, vetted: endpoints.Target
) -> Ending:
    try:
        backend = await _dial(state, vetted, "tcp")
    except BackendUnavailable as exc:
        await port.fail(f"error forwarding port {port.port} to {target.describe()}: {exc}")
        return Ending.ERROR
    try:
        return await pump(port, backend)
    finally:
        await backend.close()


async def handle_port(state: State, request: web.Request) -> web.StreamResponse:
    """KubeVirt style: one raw WebSocket per forwarded connection (or UDP flow)."""
    if request.headers.get(hdrs.UPGRADE, "").lower() != "websocket":
        raise StatusError(400, "portforward/{port} needs a WebSocket upgrade request")
    target = subresource.resolve(state, request, SUBRESOURCE)
    port = _path_port(request.match_info["port"])
    protocol = request.match_info.get("protocol", "tcp")
    if protocol not in PROTOCOLS:
        raise StatusError(400, f"unsupported protocol {protocol!r}: use tcp or udp")
    subresource.forward_url(target, port, protocol)
    dialect = channels.negotiate(offered_subprotocols(request), RAW_SUBPROTOCOLS)
    if dialect is None:
        raise StatusError(
            400, "unsupported subprotocols for portforward; supported: plain.kubevirt.io"
        )
    ws = _response(state, request, dialect.name, autoclose=False)
    vetted = await _vet(state, target, port)
    try:
        backend = await _dial(state, vetted, protocol)
    except BackendUnavailable as exc:
        raise StatusError(503, f"{target.describe()}: port {port}/{protocol}: {exc}") from None
    try:
        await ws.prepare(request)
        client = RawWebSocket(ws, batch=protocol == "tcp")
        ending = await _tracked(state, target, client, pump(client, backend))
        if ending is Ending.CLIENT:
            await client.close()
    finally:
        await backend.close()
    return ws


def _path_port(text: str) -> int:
    if text.isascii() and text.isdigit() and 0 < int(text) <= 0xFFFF:
        return int(text)
    raise StatusError(400, f"invalid port {text!r}: want a number from 1 to 65535")


def _response(
    state: State, request: web.Request, subprotocol: str, *, autoclose: bool
) -> web.WebSocketResponse:
    session = state.config.session
    ws = web.WebSocketResponse(
        protocols=(subprotocol,) if subprotocol else (),
        compress=False,
        heartbeat=session.ping_interval,
        max_msg_size=session.max_message,
        autoclose=autoclose,
    )
    if not ws.can_prepare(request).ok:
        raise StatusError(400, "malformed WebSocket upgrade request for portforward")
    return ws


async def _vet(state: State, target: Target, port: int) -> endpoints.Target:
    """The parent's address for `port`, checked by the endpoint policy (both transports)."""
    url = subresource.forward_url(target, port)
    try:
        return await endpoints.check(endpoints.parse(url), state.config.policy)
    except endpoints.EndpointError as exc:
        raise StatusError(exc.code, f"{target.describe()}: {exc}") from None


async def _dial(state: State, vetted: endpoints.Target, protocol: str) -> ByteStream:
    session = state.config.session
    started = time.monotonic()
    try:
        if protocol == "udp":
            return await datagram.dial(vetted)
        return await sockets.dial(
            vetted, connect_timeout=session.connect_timeout, read_size=session.read_size
        )
    finally:
        state.metrics.dial_seconds.labels(SUBRESOURCE).observe(time.monotonic() - started)


async def _tracked(
    state: State, target: Target, client: Closable, work: Coroutine[Any, Any, Ending]
) -> Ending:
    """Run `work` as a live session: registered for shutdown, counted, logged."""
    ending = Ending.ERROR
    active = state.metrics.sessions_active.labels(SUBRESOURCE)
    state.sessions.start(None, client)
    active.inc()
    try:
        ending = await work
    finally:
        active.dec()
        state.sessions.end(None, client)
        state.metrics.sessions.labels(SUBRESOURCE, ending.value).inc()
        log.info("portforward of %s ended by %s", target.describe(), ending.value)
    return ending
