"""`…/console` over SPDY/3.1 remote-command streams, as client-go's SPDY executor speaks them.

Protocols `v4.channel.k8s.io` down to `channel.k8s.io`, as kubelet serves
them over SPDY. client-go v0.37 also offers `v5.channel.k8s.io` first (and
would treat it as v4); kubelet does not accept v5 over SPDY, so neither do
we, and client-go settles on v4.

The client opens streams named by their `streamtype` header: `error`, then
`stdin`, `stdout`, (`stderr`), `resize`, waiting for each reply. stdin goes
to the backend, the backend's output to stdout; window sizes go to a backend
that takes them (a serial line has no size). When the backend closes: stdout
ends, v4 reports its exit status on the error stream (a Success `Status`
unless it ran a command that failed), and the session closes cleanly. One
console per machine: a newer session takes over; observers' stdin goes nowhere.
"""

from __future__ import annotations

import asyncio
import json
import logging

from aiohttp import web

from subres.engine import upgrade
from subres.engine.pump import Outcome, Traffic, pump
from subres.engine.spdy import SpdySession, SpdyStream
from subres.engine.stream import ByteStream, Terminal
from subres.engine.websocket import CloseCode
from subres.kube.status import exited, failure
from subres.protocol import httpstream
from subres.protocol.spdy import Role
from subres.server import limited, portforward_spdy
from subres.server.middleware import USER, who
from subres.server.state import State
from subres.sessions import limits, session
from subres.sessions.modes import Mode
from subres.sessions.target import Target

__all__ = ["PROTOCOLS", "STREAM_TIMEOUT", "RemoteCommandClient", "negotiate", "serve"]

log = logging.getLogger(__name__)

V4 = "v4.channel.k8s.io"
PROTOCOLS = (V4, "v3.channel.k8s.io", "v2.channel.k8s.io", "channel.k8s.io")
STREAM_TYPES = frozenset({"error", "stdin", "stdout", "stderr", "resize"})
STREAM_TIMEOUT = 30.0
"""Seconds backend output waits for the client's stdout stream (kubelet's creation timeout)."""


def negotiate(request: web.Request) -> str:
    """The remote-command protocol to speak (403 listing what is accepted)."""
    try:
        return httpstream.negotiate(
            request.headers.getall(httpstream.VERSION_HEADER, None), PROTOCOLS
        )
    except httpstream.HandshakeRefused as exc:
        raise portforward_spdy.refusal(exc) from None


async def serve(
    state: State,
    request: web.Request,
    *,
    target: Target,
    protocol: str,
    backend: ByteStream,
    exclusive: bool,
    mode: Mode,
    owner: bool = True,
) -> web.StreamResponse:
    """Take the session's slot, upgrade to SPDY and stream between its streams and `backend`
    (`owner` False: it relays to the replica that owns the unit)."""
    try:
        granted = await limited.admit(state, who(request), target=target, mode=mode)
        async with session.hold(
            state,
            request[USER].name,
            target=target,
            exclusive=exclusive,
            mode=mode,
            owner=owner,
        ) as held:
            headers = [*httpstream.switching_headers(protocol), *limits.headers(granted).items()]
            response, socket = await upgrade.upgrade(request, headers)
            spdy = SpdySession(
                socket, role=Role.SERVER, ping_interval=state.config.session.ping_interval
            )
            client = RemoteCommandClient(spdy, protocol, Terminal(backend))
            async with (
                spdy,
                session.live(
                    state,
                    who(request),
                    target=target,
                    dialect=f"spdy/{protocol}",
                    client=client,
                    held=held,
                    mode=mode,
                    backend=backend,
                    limits=granted,
                ) as live,
            ):
                await live.run(_serve(client, backend, live.record.traffic))
    finally:
        await backend.close()
    return response


async def _serve(client: RemoteCommandClient, backend: ByteStream, traffic: Traffic) -> Outcome:
    accepting = asyncio.create_task(client.accept_streams())
    try:
        return await pump(client, backend, traffic)
    finally:
        await client.session.close()
        await asyncio.wait([accepting])


class RemoteCommandClient:
    """The client side of a console session over SPDY streams: a `ClientStream`."""

    def __init__(
        self,
        session: SpdySession,
        protocol: str,
        terminal: Terminal,
    ) -> None:
        self.session = session
        self.protocol = protocol
        self.terminal = terminal
        self.streams: dict[str, SpdyStream] = {}
        self._arrived = asyncio.Event()
        self._done = False

    @property
    def gone(self) -> bool:
        """The session ended, or we finished it."""
        return self._done or self.session.ended

    async def accept_streams(self) -> None:
        """Take the client's streams until the session ends; drain resize messages."""
        resizing: set[asyncio.Task[None]] = set()
        try:
            while (stream := await self.session.accept()) is not None:
                kind = stream.header("streamtype")
                if kind not in STREAM_TYPES or kind in self.streams or self._done:
                    log.info("refusing remote-command stream %r", kind)
                    stream.reset()
                    continue
                stream.reply()
                self.streams[kind] = stream
                self._arrived.set()
                if kind == "resize":
                    resizing.add(asyncio.create_task(self._resizes(stream)))
        finally:
            self._arrived.set()
            if resizing:
                await asyncio.wait(resizing)

    async def _stream(self, kind: str) -> SpdyStream | None:
        while kind not in self.streams and not self.gone:
            self._arrived.clear()
            await self._arrived.wait()
        return None if self.gone else self.streams.get(kind)

    async def read(self) -> bytes:
        """stdin bytes; b"" at its half-close, then again once the session is over."""
        stdin = await self._stream("stdin")
        if stdin is not None and not stdin.gone:
            return await stdin.read()
        # No stdin, or the client reset it: nothing more comes until the end.
        await self._wait_gone()
        return b""

    async def _wait_gone(self) -> None:
        while not self.gone:
            self._arrived.clear()
            await self._arrived.wait()

    async def write(self, data: bytes) -> None:
        """Backend output to stdout, once the client opened it."""
        try:
            async with asyncio.timeout(STREAM_TIMEOUT):
                stdout = await self._stream("stdout")
        except TimeoutError:
            await self.abort("timed out waiting for the client to create the stdout stream")
            raise ConnectionResetError("no stdout stream") from None
        if stdout is None:
            raise ConnectionResetError("the console session is over")
        await stdout.write(data)

    async def write_eof(self) -> None:
        """The backend ended: end stdout and stderr, report success (v4), finish."""
        for kind in ("stdout", "stderr"):
            if kind in self.streams:
                await self.streams[kind].write_eof()
        status = exited(self.terminal.exit_code())
        await self._finish(json.dumps(status) if self.protocol == V4 else "")

    async def abort(self, reason: str) -> None:
        """Report `reason` as a failure on the error stream and finish."""
        await self.close(CloseCode.INTERNAL_ERROR, reason)

    async def close(self, code: int = CloseCode.NORMAL, reason: str = "") -> None:
        """Finish the session (a takeover, a shutdown), reporting `reason` unless it is normal."""
        message = ""
        if code != CloseCode.NORMAL and reason:
            message = json.dumps(failure(500, reason)) if self.protocol == V4 else reason
        await self._finish(message)

    async def _finish(self, message: str) -> None:
        """Write `message` on the error stream, end it, and wake the pump to leave.

        The session itself closes when the handler leaves: resets, GOAWAY,
        and a wait for the client to hang up first.
        """
        if self._done:
            return
        self._done = True
        error = self.streams.get("error")
        if error is not None:
            try:
                if message:
                    await error.write(message.encode())
                await error.write_eof()
            except ConnectionResetError:
                log.debug("error stream gone before the report")
        for stream in self.streams.values():
            await stream.close()
        self._arrived.set()

    async def _resizes(self, stream: SpdyStream) -> None:
        """Window sizes, one JSON object after another, to the backend when it takes them."""
        while data := await stream.read():
            self.terminal.resized(data)
