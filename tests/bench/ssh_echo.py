"""An SSH server whose console echoes, for the console benchmark, run as its own process.

`python -m tests.bench.ssh_echo PASSWORD` listens on 127.0.0.1 (any free
port) with a fresh ed25519 host key, prints `port N` and `hostkey <OpenSSH
public key>` on stdout, lets any user in with PASSWORD, and echoes every
session's input byte for byte (a PTY is granted but no line discipline runs),
until stdin closes or SIGTERM arrives. It is asyncssh, so the SSH rows measure
subres's relay plus one SSH hop in Python; the bench also times an SSH client
straight to it, to show that hop alone.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import Any

import asyncssh

from tests.bench.echo_backend import stop_on_stdin_eof

__all__ = ["main"]


class _Echo(asyncssh.SSHServerSession[bytes]):
    def __init__(self) -> None:
        self.chan: Any = None

    def connection_made(self, chan: Any) -> None:
        self.chan = chan

    def pty_requested(self, term_type: str, term_size: Any, modes: Any) -> bool:
        return True

    def shell_requested(self) -> bool:
        return True

    def data_received(self, data: bytes, datatype: asyncssh.DataType) -> None:
        self.chan.write(data)

    def eof_received(self) -> bool:
        self.chan.exit(0)
        return False


class _Server(asyncssh.SSHServer):
    # Not the demo's SshShellServer: that one lets one key in and runs shells in PTYs, this
    # one takes a password and echoes, so the bench measures the SSH hop and nothing else.
    def __init__(self, password: str) -> None:
        self.password = password

    def begin_auth(self, username: str) -> bool:
        return True

    def password_auth_supported(self) -> bool:
        return True

    def validate_password(self, username: str, password: str) -> bool:
        return password == self.password

    def session_requested(self) -> asyncssh.SSHServerSession[bytes]:
        return _Echo()


async def serve(password: str) -> None:
    """Serve until stdin reaches EOF or a signal asks us to stop."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    key = asyncssh.generate_private_key("ssh-ed25519")
    acceptor = await asyncssh.listen(
        "127.0.0.1", 0, server_host_keys=[key], server_factory=lambda: _Server(password),
        encoding=None, config=None,
    )  # fmt: skip
    port = acceptor.sockets[0].getsockname()[1]
    public = bytes(key.export_public_key("openssh")).decode().strip()
    print(f"port {port}\nhostkey {public}", flush=True)
    stop_on_stdin_eof(stop)
    await stop.wait()
    acceptor.close()


def main() -> None:
    """Entry point."""
    asyncio.run(serve(sys.argv[1]))


if __name__ == "__main__":
    main()
