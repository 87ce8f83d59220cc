"""`subres port-forward`: local ports (or stdin/stdout) forwarded to a machine, like virtctl's.

Owns the verb's flags and port syntax (`[tcp|udp/]LOCAL[:REMOTE]`), the local
listeners (TCP, and UDP with one flow per client address), the `--stdio` mode
for ssh's ProxyCommand, and the transports that carry each forwarded
connection. The default transport opens one KubeVirt-style WebSocket per
connection (`…/portforward/{port}/{tcp|udp}`): every connection is its own
HTTP upgrade, so nothing is multiplexed and any proxy that passes WebSockets
passes it. A local EOF becomes a close frame while replies keep coming, and
for UDP each datagram is one message.

Before listening it fails fast, as kubectl does: one request checks the
credentials, the machine, its state and that it allows every port asked for
(see `check`), and the local ports are bound (`--address localhost`, the
default, is 127.0.0.1 and ::1, one `Forwarding from` line each) before the
first connection arrives.

`--transport spdy` and `--transport tunnel` speak what kubectl speaks
(`subres.cli.portforward_spdy`): every connection a pair of streams on ONE
SPDY/3.1 connection. TCP only.

When the server goes away (close code 1001, a replica shutting down) or the
connection is lost, forwarding goes on and says so on stderr
(`subres.cli.reconnect.Drops`): a WebSocket's local connection ends (a TCP
stream cannot be resumed) and the next one connects again; a dropped SPDY
upstream is dialled again at once. `--no-reconnect` ends the command instead.
`--stdio` has one connection and ends with it. Meanwhile a new connection
waits (up to `OPEN_TIMEOUT`) through what passes: an unreachable or
restarting server, a 409 or 503, a kube-apiserver not ready yet
(`reconnect.worth_reconnecting`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, Protocol

from websockets.exceptions import ConnectionClosed
from websockets.protocol import State

from subres.cli import api, kubeconfig, reconnect, terminal
from subres.cli.api import CommandError, Target
from subres.cli.commands import PortSpec
from subres.cli.kubeconfig import ClientConfig
from subres.cli.portforward_spdy import SpdyLink, SpdyTransport, TunnelTransport
from subres.engine.pump import Traffic, pump
from subres.engine.stream import ByteStream
from subres.engine.wsclient import ClientWebSocket

__all__ = [
    "TRANSPORTS",
    "Link",
    "SpdyLink",
    "SpdyTransport",
    "TunnelTransport",
    "WebSocketLink",
    "WebSocketTransport",
    "bridge",
    "check",
    "main",
    "open_link",
]

SUBPROTOCOL = "plain.kubevirt.io"
NORMAL_CLOSURE = 1000
READ_SIZE = 65536
MAX_MESSAGE = 4 * 1024 * 1024
OPEN_TIMEOUT = 30.0
HALF_CLOSE_TIMEOUT = 60.0
"""After our close frame, seconds the remote side may keep replying."""
FINISH_TIMEOUT = 2.0
"""On the way out, seconds connections that are ending get to end."""
UDP_QUEUE = 256
"""Datagrams held per UDP flow while its WebSocket opens or is slow; more are dropped."""


@api.command
def main(ns: argparse.Namespace) -> int:
    """Forward until interrupted (or, with --stdio, until the connection ends)."""
    typed = api.parse_target(ns.target)
    if ns.stdio and (len(ns.ports) != 1 or ns.ports[0].protocol != "tcp"):
        raise CommandError("--stdio forwards exactly one tcp port")
    if not TRANSPORTS[ns.transport].udp and any(spec.protocol == "udp" for spec in ns.ports):
        raise CommandError(
            f"--transport {ns.transport} carries tcp only; use --transport websocket for udp"
        )
    config = kubeconfig.from_args(ns)
    return asyncio.run(_forward(config, typed, ns))


async def _forward(config: ClientConfig, typed: api.TargetText, ns: argparse.Namespace) -> int:
    group_version = ns.api_group_version
    target = await api.resolve(
        typed, config, group_version=group_version, namespace_flag=ns.namespace
    )
    drops = reconnect.Drops(reconnect=ns.reconnect and not ns.stdio)
    transport = TRANSPORTS[ns.transport](
        config, group_version=group_version, target=target, drops=drops
    )
    if ns.stdio:
        return await _stdio(transport, ns.ports[0].remote)
    await check(config, target, group_version=group_version, ports=ns.ports)
    return await _listen(transport, ns.ports, addresses=ns.address, drops=drops)


async def check(
    config: ClientConfig, target: Target, *, group_version: str, ports: list[PortSpec]
) -> None:
    """Raise what forwarding `ports` would run into, before anything listens or is dialed.

    A dry run of a Kubernetes-style port-forward (`?ports=`), which the
    server vets as a whole: credentials, permission, the machine, its state,
    the ports it allows, the endpoint policy (`api.dry_run`).
    """
    remote = ",".join(str(port) for port in dict.fromkeys(spec.remote for spec in ports))
    url = api.object_url(config, target, group_version=group_version, websocket=False)
    await api.dry_run(config, f"{url}/portforward?ports={remote}", target=target)


class Link(ByteStream, Protocol):
    """One forwarded connection (or UDP flow) as a transport carries it.

    `read` returns b"" once the remote side is done (an empty datagram is
    never delivered); `write_eof` half-closes: replies keep arriving.
    """


class Transport(Protocol):
    """How forwarded connections reach the server."""

    udp: ClassVar[bool]
    """It can carry UDP flows."""

    async def open(self, remote: int, protocol: str) -> Link:
        """A connection to the machine's `remote` port; `CommandError` when refused."""
        ...

    async def close(self) -> None:
        """Release what the connections share (the links end on their own)."""
        ...


class WebSocketLink:
    """A `Link` over one KubeVirt-style raw WebSocket.

    `on_drop` hears why, when the server (not we) ended it by going away or
    the connection was lost.
    """

    def __init__(
        self, ws: ClientWebSocket, *, on_drop: Callable[[str], None] | None = None
    ) -> None:
        self._ws = ws
        self._closing: asyncio.Task[None] | None = None
        self._on_drop = on_drop

    async def write(self, data: bytes) -> None:
        try:
            await self._ws.send(data)
        except ConnectionClosed as exc:
            raise ConnectionResetError(f"the WebSocket closed: {exc}") from None

    async def read(self) -> bytes:
        while True:
            try:
                message = await self._ws.recv()
            except ConnectionClosed:
                self._ended()
                return b""
            if message:
                return message.encode() if isinstance(message, str) else message

    async def write_eof(self) -> None:
        # The server answers our close frame only after the machine's side ended,
        # so replies keep arriving meanwhile; read() returns b"" after them.
        if self._closing is None:
            self._closing = asyncio.create_task(self._ws.close())

    async def close(self) -> None:
        self._on_drop = None  # ended here: nothing was lost
        await self._ws.close()
        if self._closing is not None:
            await self._closing

    def ended_by_server(self) -> str | None:
        """Why the server ended the link, `reason (code)`; None if it ended normally or we
        closed first."""
        protocol = self._ws.protocol
        received, sent = protocol.close_rcvd, protocol.close_sent
        if sent is not None and (received is None or not protocol.close_rcvd_then_sent):
            return None
        if received is None:
            return "lost the connection to the server" if protocol.state is State.CLOSED else None
        if received.code == NORMAL_CLOSURE:
            return None
        return f"{received.reason or 'no reason given'} ({received.code})"

    def _ended(self) -> None:
        on_drop, self._on_drop = self._on_drop, None
        why = reconnect.dropped(self._ws.close_code, self._ws.close_reason)
        if on_drop is not None and why is not None and self._closing is None:
            on_drop(why)


async def open_link(
    config: ClientConfig,
    url: str,
    *,
    target: Target,
    on_drop: Callable[[str], None] | None = None,
) -> WebSocketLink:
    """A raw KubeVirt-style WebSocket to `url`; `CommandError` with the server's reason."""
    ws = await api.connect(
        config,
        url,
        target=target,
        subprotocols=[SUBPROTOCOL],
        max_size=MAX_MESSAGE,
        close_timeout=HALF_CLOSE_TIMEOUT,
    )
    return WebSocketLink(ws, on_drop=on_drop)


class WebSocketTransport:
    """One WebSocket per forwarded connection, at `…/portforward/{port}/{protocol}`."""

    udp: ClassVar[bool] = True

    def __init__(
        self, config: ClientConfig, *, group_version: str, target: Target, drops: reconnect.Drops
    ) -> None:
        self._config = config
        self._target = target
        self._base = api.object_url(config, target, group_version=group_version)
        self._drops = drops

    async def open(self, remote: int, protocol: str) -> Link:
        url = f"{self._base}/portforward/{remote}/{protocol}"

        def dropped(why: str) -> None:
            what = f"port {remote}/{protocol}: {why}"
            self._drops.dropped(what, then="the next connection connects again")

        def say(line: str) -> None:
            print(f"port {remote}/{protocol}: {line}", file=sys.stderr, flush=True)

        def attempt() -> Awaitable[WebSocketLink]:
            return open_link(self._config, url, target=self._target, on_drop=dropped)

        if not self._drops.reconnect:
            return await attempt()
        worth_it = reconnect.reconnecting(self._config, say)
        return await reconnect.retrying(attempt, within=OPEN_TIMEOUT, worth_it=worth_it)

    async def close(self) -> None:
        pass  # nothing is shared: every link is its own WebSocket


TRANSPORTS: dict[str, type[WebSocketTransport | SpdyTransport]] = {
    "websocket": WebSocketTransport,
    "spdy": SpdyTransport,
    "tunnel": TunnelTransport,
}
"""Transports by `--transport` name."""


async def bridge(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, link: Link) -> None:
    """Copy both ways: local EOF half-closes the link; the link's end ends the local side."""
    try:
        await pump(_Local(reader, writer), link, Traffic(), grace=0)
    finally:
        await link.close()


class _Local:
    """A local connection (TCP, or stdin and stdout) as the pump's client."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._gone = False
        self._half_closed = False

    @property
    def gone(self) -> bool:
        return self._gone

    async def read(self) -> bytes:
        try:
            if data := await self._reader.read(READ_SIZE):
                return data
            if not self._half_closed:
                self._half_closed = True
                return b""
            # Nothing tells when a half-closed local peer goes: the pump stops
            # this read once the link ends or a write to the peer fails.
            await asyncio.get_running_loop().create_future()
        except OSError:
            pass  # the local peer went away
        self._gone = True
        return b""

    async def write(self, data: bytes) -> None:
        self._writer.write(data)
        await self._writer.drain()

    async def write_eof(self) -> None:
        if self._writer.can_write_eof() and not self._writer.is_closing():
            with contextlib.suppress(OSError):
                self._writer.write_eof()

    async def abort(self, reason: str) -> None:
        self._gone = True
        self._writer.close()

    async def close(self) -> None:
        self._writer.close()


async def _listen(
    transport: Transport, specs: list[PortSpec], *, addresses: list[str], drops: reconnect.Drops
) -> int:
    handlers: set[asyncio.Task[Any]] = set()
    async with contextlib.AsyncExitStack() as stack:
        # Pushed first, so it runs last: the listeners stop before the shared upstream goes,
        # and connections already ending (the server went away) finish in between.
        stack.push_async_callback(transport.close)
        stack.push_async_callback(_finish, handlers)
        for spec in specs:
            for address, port in await _start_all(stack, transport, spec, addresses, handlers):
                line = f"Forwarding from {_host(address)}:{port} -> {spec.remote}/{spec.protocol}"
                print(line, flush=True)
        with terminal.on_signals((signal.SIGINT, signal.SIGTERM), drops.stop.set):
            await drops.stop.wait()
    if drops.why is not None:
        raise CommandError(drops.why)
    return 0


async def _finish(handlers: set[asyncio.Task[Any]]) -> None:
    """Let connections that are ending end, rather than be cancelled at exit."""
    if handlers:
        await asyncio.wait(handlers, timeout=FINISH_TIMEOUT)


async def _start_all(
    stack: contextlib.AsyncExitStack,
    transport: Transport,
    spec: PortSpec,
    addresses: list[str],
    handlers: set[asyncio.Task[Any]],
) -> list[tuple[str, int]]:
    """Listen for `spec` on each address, all on one port; fail only if no address works.

    As kubectl does: a port picked for the first address is used for the
    others, and an address that cannot be had (no IPv6, say) is a warning.
    """
    bound: list[tuple[str, int]] = []
    failures: list[str] = []
    port = spec.local
    for address in addresses:
        try:
            port = await _start(stack, transport, spec._replace(local=port), address, handlers)
        except OSError as exc:
            failures.append(f"{_host(address)}:{port}: {api.os_reason(exc)}")
            continue
        bound.append((address, port))
    if not bound:
        raise CommandError(f"cannot listen on {'; '.join(failures)}")
    for failure in failures:
        print(f"warning: cannot listen on {failure}", file=sys.stderr, flush=True)
    return bound


async def _start(
    stack: contextlib.AsyncExitStack,
    transport: Transport,
    spec: PortSpec,
    address: str,
    handlers: set[asyncio.Task[Any]],
) -> int:
    """Listen for `spec` on `address`; the local port bound; each connection in `handlers`."""
    if spec.protocol == "udp":
        relay = await _UdpRelay.start(transport, spec, address)
        stack.push_async_callback(relay.close)
        return relay.port
    server = await asyncio.start_server(
        lambda r, w: _serve_tcp(transport, spec, r, w, handlers), address, spec.local
    )
    stack.push_async_callback(_stop_server, server)
    return int(server.sockets[0].getsockname()[1])


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


async def _stop_server(server: asyncio.Server) -> None:
    server.close()
    await server.wait_closed()


async def _serve_tcp(
    transport: Transport,
    spec: PortSpec,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    handlers: set[asyncio.Task[Any]],
) -> None:
    task = asyncio.current_task()
    assert task is not None
    handlers.add(task)
    try:
        link = await transport.open(spec.remote, "tcp")
        await bridge(reader, writer, link)
    except CommandError as exc:
        print(f"error: port {spec.remote}: {exc}", file=sys.stderr, flush=True)
    finally:
        writer.close()
        handlers.discard(task)


async def _stdio(transport: Transport, remote: int) -> int:
    try:
        return await _stdio_link(await transport.open(remote, "tcp"))
    finally:
        await transport.close()


async def _stdio_link(link: Link) -> int:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=2 * READ_SIZE)
    try:
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer)
        out, protocol = await loop.connect_write_pipe(
            asyncio.streams.FlowControlMixin, sys.stdout.buffer
        )
    except ValueError as exc:  # a regular file: asyncio cannot watch it
        await link.close()
        raise CommandError(f"--stdio needs pipes or sockets: {exc}") from None
    writer = asyncio.StreamWriter(out, protocol, None, loop)
    try:
        await bridge(reader, writer, link)
    finally:
        out.close()
    return 0


class _UdpFlow:
    """The WebSocket of one local UDP client address, with a bounded send queue.

    As the pump's client: a read is the next datagram the local client sent,
    a write one datagram back to it. A UDP client never ends a flow; the
    link's end does.
    """

    def __init__(self, relay: _UdpRelay, addr: Any) -> None:
        self.queue: asyncio.Queue[bytes] = asyncio.Queue(UDP_QUEUE)
        self._relay = relay
        self._addr = addr
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        try:
            link = await self._relay.transport.open(self._relay.spec.remote, "udp")
        except CommandError as exc:
            print(f"error: udp port {self._relay.spec.remote}: {exc}", file=sys.stderr, flush=True)
            return
        try:
            await pump(self, link, Traffic(), grace=0)
        finally:
            await link.close()

    @property
    def gone(self) -> bool:
        return False

    async def read(self) -> bytes:
        while not (datagram := await self.queue.get()):
            pass  # an empty datagram would read as an end: links never carry one
        return datagram

    async def write(self, data: bytes) -> None:
        self._relay.reply(data, self._addr)

    async def write_eof(self) -> None:
        pass  # UDP has no end to tell

    async def abort(self, reason: str) -> None:
        pass  # the flow ends with its link; the next datagram opens another

    async def close(self) -> None:
        pass


class _UdpRelay(asyncio.DatagramProtocol):
    """A local UDP port: each client address gets its own flow (WebSocket)."""

    def __init__(self, transport: Transport, spec: PortSpec) -> None:
        self.transport = transport
        self.spec = spec
        self.port = 0
        self._socket: asyncio.DatagramTransport | None = None
        self._flows: dict[Any, _UdpFlow] = {}

    @classmethod
    async def start(cls, transport: Transport, spec: PortSpec, address: str) -> _UdpRelay:
        relay = cls(transport, spec)
        loop = asyncio.get_running_loop()
        sock, _ = await loop.create_datagram_endpoint(
            lambda: relay, local_addr=(address, spec.local)
        )
        relay._socket = sock
        relay.port = int(sock.get_extra_info("sockname")[1])
        return relay

    def datagram_received(self, data: bytes, addr: Any) -> None:
        flow = self._flows.get(addr)
        if flow is None or flow.task.done():
            flow = self._flows[addr] = _UdpFlow(self, addr)
            flow.task.add_done_callback(lambda _: self._forget(addr, flow))
        with contextlib.suppress(asyncio.QueueFull):  # UDP may drop; a full queue does
            flow.queue.put_nowait(data)

    def _forget(self, addr: Any, flow: _UdpFlow) -> None:
        if self._flows.get(addr) is flow:
            del self._flows[addr]

    def reply(self, datagram: bytes, addr: Any) -> None:
        """Send `datagram` from the machine back to the local client at `addr`."""
        if self._socket is not None and not self._socket.is_closing():
            self._socket.sendto(datagram, addr)

    async def close(self) -> None:
        """Stop listening and end every flow."""
        if self._socket is not None:
            self._socket.close()
        tasks = [flow.task for flow in self._flows.values()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
