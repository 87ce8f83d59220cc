"""Port-forward over plain WebSockets: kubelet's channel dialect and KubeVirt's raw one.

`handle_channels` serves `…/portforward?ports=…` (v4 binary, v4 base64, or
no subprotocol): every check that can fail before the upgrade answers with a
Status (bad ports 400, a port the parent does not allow 403, endpoint policy);
with `?dryRun=All` it stops there and answers 200 (a dry run that dials
nothing, so a CLI can fail fast without counting an error);
then one backend connection per port, a dial failure reported on that port's
error channel as kubelet does, and the WebSocket closed once every port ended.

`handle_port` serves `…/portforward/{port}[/{tcp|udp}]`: one raw WebSocket per
forwarded connection, dialed before the upgrade (503 on failure), half-close
both ways, and for UDP one datagram per message.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from subres.engine.portforward_ws import ChannelMux, PortChannel, RawWebSocket
from subres.engine.pump import Ending, Outcome, Traffic, pump
from subres.kube.status import StatusError
from subres.protocol import channels, digits
from subres.protocol import portforward_ws as wire
from subres.server import handshake, limited, subresource
from subres.server.middleware import who
from subres.server.state import State
from subres.sessions import limits, session
from subres.sessions.target import Target

__all__ = ["PROTOCOLS", "RAW_SUBPROTOCOLS", "handle_channels", "handle_port"]

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
    if handshake.dry_run(request):  # `subres port-forward` checks before it listens
        for port in set(ports):
            await subresource.vet(state, target, subresource.forward_url(target, port))
        return handshake.dry_run_passed()
    handshake.check(request, what=SUBRESOURCE)
    dialect = wire.negotiate(handshake.offered_subprotocols(request))
    if dialect is None:
        supported = ", ".join(name for name in wire.DIALECTS if name)
        raise StatusError(400, f"unsupported subprotocols for portforward; supported: {supported}")
    ws = handshake.websocket_response(state, request, what=SUBRESOURCE, subprotocol=dialect)
    granted = await limited.admit(state, who(request), target=target)
    ws.headers.extend(limits.headers(granted).items())
    vetted = {
        port: await subresource.vet(state, target, subresource.forward_url(target, port))
        for port in set(ports)
    }
    response, conn = await ws.accept(request)
    mux = ChannelMux(conn, dialect, ports)
    async with session.live(
        state, who(request), target=target, dialect=dialect.name, client=mux, limits=granted
    ) as live:
        await live.run(_forward_ports(state, target, mux, vetted, live.record.traffic))
    return response


async def _forward_ports(
    state: State,
    target: Target,
    mux: ChannelMux,
    vetted: dict[int, subresource.Route],
    traffic: Traffic,
) -> Outcome:
    await mux.hello()
    reader = asyncio.create_task(mux.receive())
    forwards = [
        asyncio.create_task(_forward_port(state, target, port, vetted[port.port], traffic))
        for port in mux.ports
    ]
    try:
        outcomes = await asyncio.gather(*forwards)
    finally:
        for task in (reader, *forwards):
            task.cancel()
        await asyncio.wait([reader, *forwards])
        # kubelet closes the WebSocket (1000) once every port's forward returned.
        await mux.close()
    for ending in (Ending.ERROR, Ending.CLIENT):
        if found := [o for o in outcomes if o.ending is ending]:
            return found[0]
    return outcomes[0]


async def _forward_port(
    state: State, target: Target, port: PortChannel, vetted: subresource.Route, traffic: Traffic
) -> Outcome:
    try:
        backend = await subresource.dial(state, target, vetted)
    except StatusError as exc:
        message = f"error forwarding port {port.port}: {exc.message}"
        await port.fail(message)
        return Outcome(Ending.ERROR, message)
    try:
        return await pump(port, backend, traffic)
    finally:
        await backend.close()


async def handle_port(state: State, request: web.Request) -> web.StreamResponse:
    """KubeVirt style: one raw WebSocket per forwarded connection (or UDP flow)."""
    handshake.check(request, what="portforward/{port}")
    target = subresource.resolve(state, request, SUBRESOURCE)
    port = _path_port(request.match_info["port"])
    protocol = request.match_info.get("protocol", "tcp")
    if protocol not in PROTOCOLS:
        raise StatusError(400, f"unsupported protocol {protocol!r}: use tcp or udp")
    url = subresource.forward_url(target, port, protocol)  # 403 unless allowed
    dialect = channels.negotiate(handshake.offered_subprotocols(request), RAW_SUBPROTOCOLS)
    if dialect is None:
        raise StatusError(
            400, "unsupported subprotocols for portforward; supported: plain.kubevirt.io"
        )
    ws = handshake.websocket_response(
        state, request, what=SUBRESOURCE, subprotocol=dialect.name, autoclose=False
    )
    granted = await limited.admit(state, who(request), target=target)
    ws.headers.extend(limits.headers(granted).items())
    backend = await subresource.connect(state, target, url, protocol=protocol)
    try:
        response, conn = await ws.accept(request)
        client = RawWebSocket(conn, stream=protocol == "tcp")
        async with session.live(
            state,
            who(request),
            target=target,
            dialect=dialect.name,
            client=client,
            limits=granted,
        ) as live:
            outcome = await live.run(pump(client, backend, live.record.traffic))
            if outcome.ending is Ending.CLIENT:
                await client.close()
    finally:
        await backend.close()
    return response


def _path_port(text: str) -> int:
    port = digits.value(text, cap=0xFFFF) if digits.plain(text) else 0
    if 0 < port <= 0xFFFF:
        return port
    raise StatusError(400, f"invalid port {text!r}: want a number from 1 to 65535")
