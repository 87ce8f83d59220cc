"""SSH backends (asyncssh): a console on an SSH server, or a port-forward through one.

`Pool` keeps one SSH connection per (address, port, user, credentials, host
trust), shared by every concurrent session that needs it and closed once it
has had no session for `idle_timeout` seconds; concurrent sessions that find
no connection wait for one dial together. A connection that dies takes its
sessions with it (their channels report the loss) and is dialed afresh next
time.

Credentials come from a Secret the parent names (`credentials`): key
`ssh-privatekey` (with `ssh-passphrase` if it is encrypted) or `password`,
`username` when the URL names no user, and `known_hosts`. The server's host
key is always verified: against the Secret's `known_hosts`, or against a
fingerprint pinned in the parent (`SHA256:…`); with neither, subres refuses
to connect. An unknown or changed key is refused naming the fingerprint the
server offered. No SSH agent, no ~/.ssh files, no OpenSSH config are ever read.

Every failure before a session opens is an `SshError` with the HTTP code to
answer with: 400 for what the parent or its Secret say wrongly, 502 for an
SSH server that refuses or misbehaves, 503 for one that cannot be reached or
does not answer within the connect timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import asyncssh

from subres import fields
from subres.backends.endpoint import Target
from subres.backends.sshstream import ChannelStream, ConsoleStream, ForwardStream
from subres.backends.stream import BackendUnavailable
from subres.config import SshSpec
from subres.kube.secrets import SecretError, Secrets
from subres.protocol.channels import TerminalSize

__all__ = [
    "DEFAULT_SIZE",
    "Credentials",
    "HostTrust",
    "Pool",
    "Settings",
    "SshError",
    "command",
    "credentials",
    "login",
]

log = logging.getLogger(__name__)

DEFAULT_SIZE = TerminalSize(80, 24)
"""The PTY's size until the client says otherwise."""
KEEPALIVE_COUNT = 3
"""Unanswered keepalives after which a silent server counts as dead."""
CIPHERS = (
    "aes128-gcm@openssh.com",
    "aes256-gcm@openssh.com",
    "chacha20-poly1305@openssh.com",
    "aes128-ctr",
    "aes256-ctr",
)
"""AES-GCM first: one AES-NI call a packet, where asyncssh's default chacha20-poly1305
costs subres about 1.6x the CPU per byte (tests/bench/bench_throughput.py, ssh-pf)."""

S = TypeVar("S", bound=ChannelStream)


class SshError(BackendUnavailable):
    """An SSH backend that cannot be used; `code` is the HTTP status to answer with."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message, code)


@dataclass(frozen=True)
class Credentials:
    """Who subres logs in as."""

    username: str
    private_key: bytes = b""
    passphrase: bytes = b""
    password: str = ""

    def client_keys(self) -> list[asyncssh.SSHKey] | None:
        """The key to offer (None: no public-key authentication)."""
        if not self.private_key:
            return None
        try:
            return [asyncssh.import_private_key(self.private_key, self.passphrase or None)]
        except (asyncssh.KeyImportError, ValueError) as exc:
            raise SshError(400, f"the Secret's ssh-privatekey cannot be read: {exc}") from None


@dataclass(frozen=True)
class HostTrust:
    """How the server's host key is verified: known_hosts lines, or one pinned fingerprint."""

    known_hosts: bytes = b""
    fingerprint: str = ""


def credentials(
    secret: Mapping[str, bytes] | None, *, name: str, user: str, fingerprint: str = ""
) -> tuple[Credentials, HostTrust]:
    """Credentials and host trust from the decoded Secret `name` (400 when they will not do)."""
    if secret is None:
        raise SshError(400, f"Secret {name!r} with the SSH credentials does not exist")
    username = user or secret.get("username", b"").decode(errors="replace")
    key, password = secret.get("ssh-privatekey", b""), secret.get("password", b"")
    if not username:
        raise SshError(400, f"neither the endpoint nor Secret {name!r} names an SSH user")
    if not key and not password:
        raise SshError(400, f"Secret {name!r} holds neither ssh-privatekey nor password")
    trust = HostTrust(secret.get("known_hosts", b""), fingerprint)
    if not trust.known_hosts and not trust.fingerprint:
        raise SshError(
            400,
            f"no way to verify the SSH host key: Secret {name!r} has no known_hosts "
            "and no fingerprint is pinned",
        )
    creds = Credentials(
        username,
        private_key=key,
        passphrase=secret.get("ssh-passphrase", b""),
        password=password.decode(errors="replace"),
    )
    return creds, trust


async def login(
    secrets: Secrets, spec: SshSpec, *, obj: Mapping[str, Any], namespace: str, user: str
) -> tuple[Credentials, HostTrust]:
    """The credentials and host trust for a parent: its Secret, and its pinned fingerprint."""
    name = fields.path(spec.credentials).get(obj)
    if not isinstance(name, str) or not name:
        raise SshError(400, f"{spec.credentials} names no Secret with SSH credentials")
    pinned = fields.path(spec.host_key).get(obj) if spec.host_key else None
    if pinned is not None and not isinstance(pinned, str):
        raise SshError(400, f"{spec.host_key} is not a fingerprint")
    try:
        secret = await secrets.get(namespace, name)
    except SecretError as exc:
        raise SshError(503, str(exc)) from None
    return credentials(secret, name=name, user=user, fingerprint=pinned or "")


def command(spec: SshSpec, obj: Mapping[str, Any]) -> str:
    """The console's command, its `{field}` placeholders filled in (400 on an unsafe value)."""
    if "{" not in spec.command:
        return spec.command
    try:
        return fields.template(spec.command).render(obj)
    except fields.FieldError as exc:
        raise SshError(400, f"console command: {exc}") from None


@dataclass(frozen=True)
class Settings:
    """How the pool dials and keeps connections."""

    connect_timeout: float
    """Seconds for TCP connect, handshake, authentication and opening a channel."""
    idle_timeout: float = 60.0
    """Seconds a connection with no session stays open."""
    keepalive_interval: float = 10.0
    """Seconds between keepalives; `KEEPALIVE_COUNT` unanswered ones end the connection."""
    read_size: int = 65536
    """A channel pauses reading when four times this much waits unread."""


Key = tuple[str, int, str, str]


@dataclass(eq=False)
class _Connection:
    conn: asyncssh.SSHClientConnection
    users: int = 0
    idle: asyncio.TimerHandle | None = None


class _Client(asyncssh.SSHClient):
    """Verifies a pinned fingerprint, remembers the key offered, reports a lost connection."""

    def __init__(self, trust: HostTrust, lost: Callable[[], None]) -> None:
        self._trust = trust
        self._lost = lost
        self.offered = ""

    def validate_host_public_key(
        self, host: str, addr: str, port: int, key: asyncssh.SSHKey
    ) -> bool:
        """Called for a key known_hosts does not list: only a pinned fingerprint may match."""
        self.offered = key.get_fingerprint("sha256")
        return bool(self._trust.fingerprint) and self.offered == self._trust.fingerprint

    def connection_lost(self, exc: Exception | None) -> None:
        """Forget the connection so the next session dials afresh."""
        self._lost()


@dataclass
class Pool:
    """Shared SSH connections, and the channels opened on them."""

    settings: Settings
    _live: dict[Key, _Connection] = field(default_factory=dict)
    _dialing: dict[Key, asyncio.Task[_Connection]] = field(default_factory=dict)
    _closing: set[asyncio.Task[None]] = field(default_factory=set)

    def __len__(self) -> int:
        """Connections open now."""
        return len(self._live)

    async def console(
        self,
        target: Target,
        creds: Credentials,
        trust: HostTrust,
        *,
        term: str,
        command: str = "",
        size: TerminalSize = DEFAULT_SIZE,
    ) -> ConsoleStream:
        """A PTY session on `target` running a login shell, or `command`."""

        async def open_session(conn: asyncssh.SSHClientConnection, stream: ConsoleStream) -> None:
            await conn.create_session(
                lambda: stream,
                command or None,
                term_type=term,
                term_size=(size.width, size.height),
                encoding=None,
            )

        return await self._channel(target, creds, trust, ConsoleStream, open_session)

    async def forward(
        self, jump: Target, creds: Credentials, trust: HostTrust, *, host: str, port: int
    ) -> ForwardStream:
        """A direct-tcpip channel through `jump` to `host:port` (as the SSH server sees them)."""

        async def open_forward(conn: asyncssh.SSHClientConnection, stream: ForwardStream) -> None:
            await conn.create_connection(lambda: stream, host, port, encoding=None)

        return await self._channel(jump, creds, trust, ForwardStream, open_forward)

    async def close(self) -> None:
        """Close every connection (server shutdown)."""
        for task in list(self._dialing.values()):
            task.cancel()
        for key in list(self._live):
            self._drop(key)
        waiting = [*self._dialing.values(), *self._closing]
        if waiting:
            await asyncio.wait(waiting, timeout=self.settings.connect_timeout)

    async def _channel(
        self,
        target: Target,
        creds: Credentials,
        trust: HostTrust,
        kind: type[S],
        open_channel: Callable[[asyncssh.SSHClientConnection, S], Awaitable[None]],
    ) -> S:
        where = f"{target.endpoint.host}:{target.endpoint.port}"
        key = _key(target, creds, trust)
        timeout = self.settings.connect_timeout
        entry = await self._acquire(key, target, creds, trust)
        stream = kind(
            high_water=4 * self.settings.read_size, release=lambda: self._release(key, entry)
        )
        try:
            async with asyncio.timeout(timeout):
                await open_channel(entry.conn, stream)
                await _window_opened(stream)
        except TimeoutError:
            await stream.close()
            raise SshError(
                503, f"SSH server {where} opened no channel with room to send within {timeout:g}s"
            ) from None
        except asyncssh.ChannelOpenError as exc:
            await stream.close()
            raise SshError(502, f"SSH server {where} refused the channel: {exc.reason}") from None
        except (OSError, asyncssh.Error) as exc:
            await stream.close()
            raise SshError(502, f"SSH server {where} failed opening a channel: {exc}") from None
        except BaseException:
            await stream.close()
            raise
        return stream

    async def _acquire(
        self, key: Key, target: Target, creds: Credentials, trust: HostTrust
    ) -> _Connection:
        entry = self._live.get(key)
        if entry is None:
            task = self._dialing.get(key)
            if task is None:
                task = asyncio.create_task(self._dial(key, target, creds, trust))
                self._dialing[key] = task
                task.add_done_callback(lambda t: self._dialed(key, t))
            # One dial for every session waiting; a session that gives up leaves it running.
            entry = await asyncio.shield(task)
        entry.users += 1
        if entry.idle is not None:
            entry.idle.cancel()
            entry.idle = None
        return entry

    def _dialed(self, key: Key, task: asyncio.Task[_Connection]) -> None:
        if self._dialing.get(key) is task:
            del self._dialing[key]
        if not task.cancelled() and task.exception() is None:
            entry = task.result()
            if entry.users == 0:  # every waiter gave up: idle from the start
                self._schedule_idle(key, entry)

    async def _dial(
        self, key: Key, target: Target, creds: Credentials, trust: HostTrust
    ) -> _Connection:
        entry: _Connection | None = None

        def lost() -> None:
            if entry is not None and self._live.get(key) is entry:
                del self._live[key]
                if entry.idle is not None:
                    entry.idle.cancel()

        client = _Client(trust, lost)
        conn = await _connect(target, creds, trust, client, self.settings)
        entry = _Connection(conn)
        self._live[key] = entry
        return entry

    def _release(self, key: Key, entry: _Connection) -> None:
        entry.users -= 1
        if entry.users == 0 and self._live.get(key) is entry:
            self._schedule_idle(key, entry)

    def _schedule_idle(self, key: Key, entry: _Connection) -> None:
        loop = asyncio.get_running_loop()
        entry.idle = loop.call_later(self.settings.idle_timeout, self._expire, key, entry)

    def _expire(self, key: Key, entry: _Connection) -> None:
        if entry.users == 0 and self._live.get(key) is entry:
            self._drop(key)

    def _drop(self, key: Key) -> None:
        entry = self._live.pop(key)
        if entry.idle is not None:
            entry.idle.cancel()
        entry.conn.close()
        task = asyncio.get_running_loop().create_task(_wait_closed(entry.conn))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)


def _key(target: Target, creds: Credentials, trust: HostTrust) -> Key:
    digest = hashlib.sha256()
    for part in (creds.private_key, creds.passphrase, creds.password.encode()):
        digest.update(len(part).to_bytes(4, "big") + part)
    for part in (trust.known_hosts, trust.fingerprint.encode(), target.endpoint.host.encode()):
        digest.update(len(part).to_bytes(4, "big") + part)
    return (target.address, target.endpoint.port, creds.username, digest.hexdigest())


async def _connect(
    target: Target, creds: Credentials, trust: HostTrust, client: _Client, settings: Settings
) -> asyncssh.SSHClientConnection:
    ep = target.endpoint
    where = f"{ep.host}:{ep.port}"
    timeout = settings.connect_timeout
    options: dict[str, Any] = {
        "username": creds.username,
        "client_keys": creds.client_keys(),
        "password": creds.password or None,
        "known_hosts": _known_hosts(trust),
        "host_key_alias": ep.host if ep.host != target.address else None,
        # Nothing from this process's user: no agent, no ~/.ssh keys or config.
        "agent_path": None,
        "config": None,
        "gss_auth": False,
        "gss_kex": False,
        "host_based_auth": False,
        "connect_timeout": timeout,
        "login_timeout": timeout,
        "keepalive_interval": settings.keepalive_interval,
        "keepalive_count_max": KEEPALIVE_COUNT,
        "encryption_algs": CIPHERS,
    }
    try:
        async with asyncio.timeout(timeout):
            return await asyncssh.connect(
                target.address, ep.port, client_factory=lambda: client, **options
            )
    except TimeoutError:
        raise SshError(
            503, f"SSH server {where} did not complete login within {timeout:g}s"
        ) from None
    except asyncssh.HostKeyNotVerifiable:
        offered = client.offered or "unknown"
        how = "the pinned fingerprint" if trust.fingerprint else "the Secret's known_hosts"
        raise SshError(
            502, f"SSH server {where} offered host key {offered}, which {how} does not trust"
        ) from None
    except asyncssh.PermissionDenied:
        raise SshError(
            502, f"SSH server {where} refused the credentials of user {creds.username!r}"
        ) from None
    except asyncssh.Error as exc:
        raise SshError(502, f"SSH handshake with {where} failed: {exc.reason}") from None
    except OSError as exc:
        raise SshError(
            503, f"cannot connect to SSH server {where}: {exc.strerror or exc}"
        ) from None


def _known_hosts(trust: HostTrust) -> Any:
    if not trust.known_hosts:
        # An empty trusted list (not None: that would trust anything) sends every key to
        # _Client.validate_host_public_key, which checks the pinned fingerprint.
        return ([], [], [])
    try:
        return asyncssh.import_known_hosts(trust.known_hosts.decode(errors="replace"))
    except (ValueError, asyncssh.KeyImportError) as exc:
        raise SshError(400, f"the Secret's known_hosts cannot be read: {exc}") from None


async def _window_opened(stream: ChannelStream) -> None:
    """Wait until the server lets us send (a hostile one may open a channel with no window)."""
    # asyncssh signals nothing for a window that grows from zero with nothing queued.
    while stream.send_window() == 0:  # noqa: ASYNC110 - no event exists for it
        await asyncio.sleep(0.05)


async def _wait_closed(conn: asyncssh.SSHClientConnection) -> None:
    with contextlib.suppress(Exception):
        await conn.wait_closed()
