"""Real SSH servers for the SSH backend tests: OpenSSH's sshd, and an asyncssh server.

`openssh` starts Debian's `/usr/sbin/sshd` on a free loopback port with a
host key and a user key generated for the test, logging to a file, as the
test's own user (unprivileged unless the test runs as root; sshd then needs
its privilege separation directory, which Debian's service creates the same
way). It lets that user in with the key only, and forwards TCP.

`SshServer` is an asyncssh server whose behaviour a test chooses: a console
that echoes and reports window changes and exit statuses, password or key
logins, direct-tcpip allowed or refused, channels opened with no window; it
counts connections and can drop them all (a server that dies).
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import os
import re
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncssh

from tests.support import free_port

__all__ = [
    "PASSWORD",
    "Keys",
    "OpenSsh",
    "SshServer",
    "keys",
    "known_hosts_line",
    "openssh",
    "secret",
]

SSHD = Path("/usr/sbin/sshd")
PRIVSEP_DIR = Path("/run/sshd")
START_TIMEOUT = 15.0
PASSWORD = "correct horse battery staple"


@dataclass(frozen=True)
class Keys:
    """A host key and a user key, generated for one test."""

    host: asyncssh.SSHKey
    user: asyncssh.SSHKey

    @property
    def fingerprint(self) -> str:
        """The host key's `SHA256:…` fingerprint."""
        return str(self.host.get_fingerprint("sha256"))

    def user_private(self) -> bytes:
        return bytes(self.user.export_private_key("openssh"))


def keys() -> Keys:
    """Fresh ed25519 host and user keys."""
    return Keys(
        asyncssh.generate_private_key("ssh-ed25519"), asyncssh.generate_private_key("ssh-ed25519")
    )


def known_hosts_line(key: asyncssh.SSHKey, port: int, host: str = "127.0.0.1") -> bytes:
    """One known_hosts line trusting `key` for `host:port`."""
    public = bytes(key.export_public_key("openssh")).strip()
    return b"[" + host.encode() + b"]:" + str(port).encode() + b" " + public + b"\n"


def secret(name: str, data: dict[str, bytes | str], namespace: str = "default") -> dict[str, Any]:
    """A Secret object as the standalone file holds it (stringData)."""
    strings = {k: v.decode() if isinstance(v, bytes) else v for k, v in data.items()}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "stringData": strings,
    }


# -- OpenSSH ----------------------------------------------------------------------


@dataclass
class OpenSsh:
    """A running sshd."""

    port: int
    user: str
    keys: Keys
    process: asyncio.subprocess.Process
    log: Path

    @property
    def url(self) -> str:
        return f"ssh://{self.user}@127.0.0.1:{self.port}"

    def known_hosts(self) -> bytes:
        return known_hosts_line(self.keys.host, self.port)

    def logs(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    async def kill(self) -> None:
        """Kill sshd and every process it forked (the server dies: connections drop).

        Each connection's sshd makes a session of its own, so the process group
        is not enough: the tree under the listener is found through /proc.
        """
        for pid in [self.process.pid, *_descendants(self.process.pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        await self.process.wait()


def _descendants(root: int) -> list[int]:
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # The command name may hold spaces and parentheses: the fields after the last ")".
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = [], [root]
    while frontier:
        children = [pid for pid, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def _sshd_config(workdir: Path, k: Keys, *, port: int, user: str, options: str) -> Path:
    """The host key, authorized_keys and sshd_config for one test's sshd."""
    if not SSHD.exists():
        raise AssertionError(f"{SSHD} is missing: scripts/test installs Debian's openssh-server")
    if os.geteuid() == 0:
        PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
    workdir.mkdir(parents=True, exist_ok=True)
    host_key = workdir / "host_key"
    host_key.write_bytes(bytes(k.host.export_private_key("openssh")))
    host_key.chmod(0o600)
    (workdir / "authorized_keys").write_bytes(bytes(k.user.export_public_key("openssh")))
    config = workdir / "sshd_config"
    config.write_text(  # sshd keeps the first value of a keyword: the test's options first
        options + f"ListenAddress 127.0.0.1:{port}\nHostKey {host_key}\n"
        f"AuthorizedKeysFile {workdir / 'authorized_keys'}\nAllowUsers {user}\n"
        "PidFile none\nUsePAM no\nStrictModes no\nPermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "AllowTcpForwarding yes\nLogLevel VERBOSE\n"
    )
    return config


@contextlib.asynccontextmanager
async def openssh(
    workdir: Path, *, options: str = "", with_keys: Keys | None = None, port: int = 0
) -> AsyncIterator[OpenSsh]:
    """sshd on loopback; `options` are extra sshd_config lines.

    New keys and a free port unless given (a server restarted as the same host).
    """
    k, port, user = with_keys or keys(), port or free_port(), getpass.getuser()
    config = _sshd_config(workdir, k, port=port, user=user, options=options)
    log = workdir / "sshd.log"
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            str(SSHD), "-D", "-e", "-f", str(config),
            stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
        )  # fmt: skip
    server = OpenSsh(port, user, k, proc, log)
    try:
        async with asyncio.timeout(START_TIMEOUT):
            while "Server listening on" not in server.logs():
                if proc.returncode is not None:
                    raise AssertionError(f"sshd exited {proc.returncode}: {server.logs()}")
                await asyncio.sleep(0.02)  # sshd says it listens only in its log
        yield server
    finally:
        if proc.returncode is None:
            await server.kill()


# -- asyncssh server -----------------------------------------------------------------


class _Console(asyncssh.SSHServerSession[bytes]):
    """Echoes input, says `size WxH` on window changes, `exit N` / `signal NAME` end it."""

    def __init__(self, server: SshServer) -> None:
        self.server = server
        self.chan: Any = None
        self.line = b""

    def connection_made(self, chan: Any) -> None:
        self.chan = chan

    def pty_requested(
        self, term_type: str, term_size: tuple[int, int, int, int], modes: Any
    ) -> bool:
        self.server.terms.append((term_type, term_size[0], term_size[1]))
        return True

    def shell_requested(self) -> bool:
        return True

    def exec_requested(self, command: str) -> bool:
        self.server.commands.append(command)
        return True

    def session_started(self) -> None:
        self.chan.write(b"ready\r\n")

    def terminal_size_changed(self, width: int, height: int, pixwidth: int, pixheight: int) -> None:
        self.chan.write(f"size {width}x{height}\r\n".encode())

    def data_received(self, data: bytes, datatype: asyncssh.DataType) -> None:
        self.server.received.extend(data)
        self.chan.write(data)
        self.line += data
        while b"\r" in self.line:
            line, self.line = self.line.split(b"\r", 1)
            self._command(line.strip().decode(errors="replace"))

    def eof_received(self) -> bool:
        self.server.eofs += 1
        self.chan.exit(0)
        return False

    def _command(self, line: str) -> None:
        if match := re.fullmatch(r"exit (\d+)", line):
            self.chan.exit(int(match[1]))
        elif match := re.fullmatch(r"signal ([A-Z]+)", line):
            self.chan.exit_with_signal(match[1])


class _Server(asyncssh.SSHServer):
    def __init__(self, owner: SshServer) -> None:
        self.owner = owner

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self.owner.connections.append(conn)

    def connection_lost(self, exc: Exception | None) -> None:
        self.owner.closed += 1

    def begin_auth(self, username: str) -> bool:
        return True

    def password_auth_supported(self) -> bool:
        return True

    def validate_password(self, username: str, password: str) -> bool:
        return password == PASSWORD

    def public_key_auth_supported(self) -> bool:
        return True

    def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        return key == self.owner.keys.user.convert_to_public()

    def session_requested(self) -> asyncssh.SSHServerSession[bytes]:
        return _Console(self.owner)

    def connection_requested(
        self, dest_host: str, dest_port: int, orig_host: str, orig_port: int
    ) -> bool:
        self.owner.forwards.append((dest_host, dest_port))
        return self.owner.allow_forwarding


@dataclass
class SshServer:
    """An asyncssh server on loopback whose behaviour the test sets."""

    keys: Keys = field(default_factory=keys)
    allow_forwarding: bool = True
    window: int | None = None
    """Initial channel window to advertise (0: a window that never opens)."""
    port: int = 0
    connections: list[asyncssh.SSHServerConnection] = field(default_factory=list)
    closed: int = 0
    terms: list[tuple[str, int, int]] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    forwards: list[tuple[str, int]] = field(default_factory=list)
    received: bytearray = field(default_factory=bytearray)
    eofs: int = 0
    _acceptor: asyncssh.SSHAcceptor | None = None

    @property
    def url(self) -> str:
        return f"ssh://tester@127.0.0.1:{self.port}"

    def known_hosts(self) -> bytes:
        return known_hosts_line(self.keys.host, self.port)

    async def start(self) -> SshServer:
        extra: dict[str, Any] = {} if self.window is None else {"window": self.window}
        self._acceptor = await asyncssh.listen(
            "127.0.0.1", 0, server_host_keys=[self.keys.host], server_factory=lambda: _Server(self),
            encoding=None, config=None, **extra,
        )  # fmt: skip
        self.port = int(self._acceptor.sockets[0].getsockname()[1])
        return self

    def drop(self) -> None:
        """Every connection lost at once, as if the server died."""
        for conn in self.connections:
            conn.abort()

    async def stop(self) -> None:
        if self._acceptor is not None:
            self._acceptor.close()
            await self._acceptor.wait_closed()
        for conn in self.connections:
            conn.abort()
        await asyncio.gather(*(c.wait_closed() for c in self.connections), return_exceptions=True)
