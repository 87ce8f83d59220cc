"""IPMI Serial-over-LAN consoles: an RMCP+ session with a BMC over UDP, as a `ByteStream`.

`open_console` logs in to the BMC (`ipmi://host[:port]`), activates SOL and
returns an `IpmiConsole`, the asyncio driver of `subres.protocol.ipmi.client`:
datagrams go to the codec as they arrive, its timer (retries, keepalives)
runs on the loop, and what it wants sent is sent. Every failure before the
console opens is an `IpmiError` with the HTTP code to answer with, within
the connect timeout: 400 for what the parent or its Secret say wrongly, 409
when SOL is active on another BMC session (unless `takeover`), 502 when the
BMC refuses (credentials, cipher suite, privilege) or breaks the protocol,
503 when it does not answer.

Credentials come from the Secret the parent names (`username`, `password`);
they never reach a log line, an Event or a message. Flow control: characters
the reader has not taken are bounded (`window`); beyond that the BMC is
NACKed, so a slow client stalls the serial port instead of making the BMC
drop characters. Writers wait while more than `high_water` characters are
not yet accepted by the BMC.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from subres import fields
from subres.backends.endpoint import Target
from subres.backends.stream import BackendUnavailable
from subres.config import IpmiSpec
from subres.kube.secrets import SecretError, Secrets
from subres.protocol.ipmi import client, crypto
from subres.protocol.ipmi.errors import Fault
from subres.protocol.ipmi.events import (
    DataReceived,
    Event,
    PayloadActivated,
    PayloadDeactivated,
    SessionClosed,
    SessionFailed,
    StaleSessionDeactivated,
)

__all__ = ["Credentials", "IpmiConsole", "IpmiError", "Timing", "login", "open_console", "settings"]

log = logging.getLogger(__name__)

CODES = {
    Fault.CREDENTIALS: 502,
    Fault.REFUSED: 502,
    Fault.PROTOCOL: 502,
    Fault.BUSY: 409,
    Fault.TIMEOUT: 503,
}
"""The HTTP code of a session that could not be opened, by whose fault."""
PRIVILEGES = {
    "user": client.Privilege.USER,
    "operator": client.Privilege.OPERATOR,
    "administrator": client.Privilege.ADMINISTRATOR,
}


class IpmiError(BackendUnavailable):
    """A BMC console that cannot be opened; `code` is the HTTP status to answer with."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message, code)


@dataclass(frozen=True)
class Credentials:
    """Who subres logs in to the BMC as."""

    username: str
    password: bytes = field(repr=False)


@dataclass(frozen=True)
class Timing:
    """How patiently the driver talks to a BMC."""

    connect_timeout: float
    """Seconds for the whole login and SOL activation."""
    keepalive: float = 10.0
    """Seconds without a packet from the BMC before a keepalive request."""
    window: int = 65536
    """Received characters that may wait for the reader before the BMC is NACKed."""
    high_water: int = 65536
    """Characters not yet accepted by the BMC beyond which writers wait."""

    @property
    def retry_interval(self) -> float:
        """Seconds before a request or SOL packet is sent again: four sends fit the timeout."""
        return min(1.0, self.connect_timeout / 4)


def credentials(secret: Mapping[str, bytes] | None, *, name: str) -> Credentials:
    """The user name and password from the decoded Secret `name` (400 when they will not do)."""
    if secret is None:
        raise IpmiError(400, f"Secret {name!r} with the IPMI credentials does not exist")
    username, password = secret.get("username", b""), secret.get("password", b"")
    if not username or not password:
        raise IpmiError(400, f"Secret {name!r} needs both `username` and `password`")
    if len(username) > 16 or len(password) > 20:
        raise IpmiError(
            400, f"Secret {name!r}: IPMI allows user names of 16 bytes, passwords of 20"
        )
    return Credentials(username.decode(errors="replace"), password)


async def login(
    secrets: Secrets, spec: IpmiSpec, *, obj: Mapping[str, Any], namespace: str
) -> Credentials:
    """The credentials for a parent, from the Secret it names."""
    name = fields.path(spec.credentials).get(obj)
    if not isinstance(name, str) or not name:
        raise IpmiError(400, f"{spec.credentials} names no Secret with IPMI credentials")
    try:
        secret = await secrets.get(namespace, name)
    except SecretError as exc:
        raise IpmiError(503, str(exc)) from None
    return credentials(secret, name=name)


def settings(
    spec: IpmiSpec, options: tuple[tuple[str, str], ...], creds: Credentials, timing: Timing
) -> client.Settings:
    """The codec's settings: the configuration, with what the endpoint's query chose."""
    chosen = dict(options)
    privilege = chosen.get("privilege", spec.privilege)
    if privilege not in PRIVILEGES:
        raise IpmiError(400, f"IPMI privilege {privilege!r} is not one of {', '.join(PRIVILEGES)}")
    suite_text = chosen.get("cipherSuite", str(spec.cipher_suite))
    suite = crypto.SUITES.get(int(suite_text)) if suite_text.isdigit() else None
    if suite is None:
        raise IpmiError(400, f"IPMI cipher suite {suite_text!r} is not spoken here (1, 2 or 3)")
    if suite.number == 0 and not spec.allow_cipher_suite_zero:
        raise IpmiError(
            400, "IPMI cipher suite 0 (no authentication or encryption) is not allowed here"
        )
    return client.Settings(
        username=creds.username.encode(),
        password=creds.password,
        suite=suite,
        privilege=PRIVILEGES[privilege],
        takeover=spec.takeover,
        retry_interval=timing.retry_interval,
        keepalive=timing.keepalive,
        window=timing.window,
    )


class IpmiConsole(asyncio.DatagramProtocol):
    """One BMC's SOL as a byte stream: the UDP socket, the codec and its timer."""

    def __init__(self, codec: client.Client, *, where: str, port: int, high_water: int) -> None:
        self._codec = codec
        self._where = where
        self._port = port
        self._high_water = high_water
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.DatagramTransport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._chunks: collections.deque[bytes] = collections.deque()
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()
        self._ended = asyncio.Event()
        self.activated: asyncio.Future[None] = self._loop.create_future()
        self.failure = ""
        """Why the console ended, when it did not end as asked (empty otherwise)."""
        self.notice = ""
        """What the login did that an audit should know (a stale SOL session taken over)."""

    # asyncio's side --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Keep the socket and start the handshake."""
        self._transport = cast(asyncio.DatagramTransport, transport)
        self._codec.start(self._loop.time())
        self._flush()

    def datagram_received(self, data: bytes, addr: Any) -> None:
        """One packet from the BMC, to the codec."""
        self._handle(self._codec.receive(data, self._loop.time()))
        self._flush()

    def error_received(self, exc: Exception) -> None:
        """An ICMP error: nothing listens on the BMC's port (any more)."""
        reason = getattr(exc, "strerror", None) or str(exc)
        self._fail(f"the BMC {self._where} is unreachable: {reason}", Fault.TIMEOUT)

    def connection_lost(self, exc: Exception | None) -> None:
        """The socket closed."""
        self._end()

    # the pump's side -------------------------------------------------------------

    async def read(self) -> bytes:
        """The next characters from the serial port; b"" once the session ended as asked.

        A session the BMC ended or lost raises `ConnectionResetError` saying why.
        """
        while not self._chunks:
            if self.failure:
                raise ConnectionResetError(self.failure)
            if self._ended.is_set():
                return b""
            self._readable.clear()
            await self._readable.wait()
        data = self._chunks.popleft()
        self._codec.consumed(len(data))
        self._flush()
        return data

    async def write(self, data: bytes) -> None:
        """Send characters to the serial port; wait while the BMC is behind."""
        if self._ended.is_set() or self._codec.state is not client.State.ACTIVE:
            raise ConnectionResetError(self.failure or "the IPMI session is closed")
        self._codec.send(data, self._loop.time())
        self._handle([])  # past the high-water mark, this write waits until the BMC catches up
        self._flush()
        await self._writable.wait()
        if self.failure:
            raise ConnectionResetError(self.failure)

    async def write_eof(self) -> None:
        """A serial line has no end of input: nothing to send."""

    def send_break(self) -> None:
        """A break on the serial line."""
        if not self._ended.is_set() and self._codec.state is client.State.ACTIVE:
            self._codec.send_break(self._loop.time())
            self._flush()

    async def close(self) -> None:
        """Deactivate SOL and close the session (bounded), then the socket."""
        if not self._ended.is_set() and self._codec.state is not client.State.IDLE:
            self._handle(self._codec.close(self._loop.time()))
            self._flush()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._codec.settings.retry_interval * 5):
                    await self._ended.wait()
        self._end()
        if not self.activated.cancelled():
            self.activated.exception()  # retrieved: a failed login is reported by open_console

    # the codec's side ------------------------------------------------------------

    def _handle(self, events: list[Event]) -> None:
        for event in events:
            self._event(event)
        sol = self._codec.sol
        if sol is not None and sol.unsent <= self._high_water:
            self._writable.set()
        elif sol is not None:
            self._writable.clear()

    def _event(self, event: Event) -> None:
        if isinstance(event, DataReceived):
            self._chunks.append(event.data)
            self._readable.set()
        elif isinstance(event, PayloadActivated):
            if event.port not in (0, self._port):
                self._fail(
                    f"the BMC {self._where} wants SOL on UDP port {event.port}, "
                    "which is not spoken here",
                    Fault.REFUSED,
                )
            elif not self.activated.done():
                self.activated.set_result(None)
        elif isinstance(event, StaleSessionDeactivated):
            self.notice = "SOL was active on another session of the BMC: deactivated it"
            log.warning("IPMI %s: %s", self._where, self.notice)
        elif isinstance(event, PayloadDeactivated):
            self._fail(f"the BMC {self._where} ended SOL: {event.reason}", Fault.PROTOCOL)
        elif isinstance(event, SessionFailed):
            self._fail(f"IPMI session with {self._where}: {event.reason}", event.fault)
        elif isinstance(event, SessionClosed):
            self._end()

    def _fail(self, reason: str, fault: Fault) -> None:
        if self._ended.is_set():
            return
        if not self.activated.done():
            self.activated.set_exception(IpmiError(CODES[fault], reason))
        self.failure = reason
        self._end()

    def _end(self) -> None:
        self._ended.set()
        self._readable.set()
        self._writable.set()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._transport is not None:
            self._transport.close()
        if not self.activated.done():
            self.activated.set_exception(IpmiError(503, f"the BMC {self._where} closed"))

    def _flush(self) -> None:
        transport = self._transport
        if transport is None or self._ended.is_set():
            return
        for datagram in self._codec.datagrams():
            transport.sendto(datagram)
        if self._timer is not None:
            self._timer.cancel()
        deadline = self._codec.deadline()
        self._timer = None if deadline is None else self._loop.call_at(deadline, self._tick)

    def _tick(self) -> None:
        self._timer = None
        self._handle(self._codec.tick(self._loop.time()))
        self._flush()


async def open_console(
    target: Target, creds: Credentials, spec: IpmiSpec, *, timing: Timing
) -> IpmiConsole:
    """Log in to the BMC at `target` and activate SOL, within the connect timeout."""
    ep = target.endpoint
    where = f"{ep.host}:{ep.port}"
    codec = client.Client(settings(spec, ep.options, creds, timing))
    loop = asyncio.get_running_loop()

    def protocol() -> IpmiConsole:
        return IpmiConsole(codec, where=where, port=ep.port, high_water=timing.high_water)

    try:
        _, console = await loop.create_datagram_endpoint(
            protocol, remote_addr=(target.address, ep.port)
        )
    except OSError as exc:
        raise IpmiError(503, f"cannot reach the BMC {where}: {exc.strerror or exc}") from None
    try:
        async with asyncio.timeout(timing.connect_timeout):
            await console.activated
    except TimeoutError:
        await console.close()
        raise IpmiError(
            503, f"the BMC {where} did not open SOL within {timing.connect_timeout:g}s"
        ) from None
    except BaseException:
        await console.close()
        raise
    return console
