"""The demo machine's console: a shell in a real PTY, served by an SSH server on loopback.

SSH is how a terminal's size reaches a shell that is not on this terminal:
subres's `ssh://` backend turns every console client's resizes into window
changes, and this server applies them to the PTY (the kernel then signals the
shell with SIGWINCH), so `stty size` in the demo shell follows the client's
window. It lets in one client key (the demo's Secret holds it) and serves
shells only; the shell's exit status (or signal) goes back to the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import pty
import signal
import struct
import termios
from pathlib import Path
from typing import Any

import asyncssh

from subres.demo import shell as shells

__all__ = ["SshShellServer"]

log = logging.getLogger(__name__)

HIGH_WATER = 256 * 1024
"""Bytes of client input queued for the PTY before the channel stops reading."""
DEFAULT_SIZE = (80, 24)


class SshShellServer:
    """An SSH server on 127.0.0.1 whose sessions are shells in PTYs."""

    def __init__(
        self,
        *,
        shell: str,
        host_key: asyncssh.SSHKey,
        client_key: asyncssh.SSHKey,
        inputrc: Path,
    ) -> None:
        self.shell = shell
        self.home = os.path.expanduser("~")
        self.inputrc = inputrc
        """The shells' readline settings (written at start)."""
        self.host_key = host_key
        self.client_private = client_key
        """The one key let in (the demo writes it into the console's Secret)."""
        self.client_key = client_key.convert_to_public()
        self.port = 0
        self._acceptor: asyncssh.SSHAcceptor | None = None
        self._sessions: set[_ShellSession] = set()

    def known_hosts(self) -> str:
        """The known_hosts line a client needs to trust this server."""
        public = bytes(self.host_key.export_public_key("openssh")).decode().strip()
        return f"[127.0.0.1]:{self.port} {public}\n"

    async def start(self) -> None:
        """Listen on a free loopback port."""
        await asyncio.to_thread(shells.write_inputrc, self.inputrc, home=self.home)
        self._acceptor = await asyncssh.listen(
            "127.0.0.1",
            0,
            server_host_keys=[self.host_key],
            server_factory=lambda: _Server(self),
            encoding=None,
            config=None,
        )
        self.port = int(self._acceptor.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Stop listening and hang up on every shell."""
        if self._acceptor is not None:
            self._acceptor.close()
            await self._acceptor.wait_closed()
        await asyncio.gather(*(s.stop() for s in list(self._sessions)))


class _Server(asyncssh.SSHServer):
    def __init__(self, owner: SshShellServer) -> None:
        self.owner = owner

    def begin_auth(self, username: str) -> bool:
        return True

    def public_key_auth_supported(self) -> bool:
        return True

    def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        return key == self.owner.client_key

    def session_requested(self) -> asyncssh.SSHServerSession[bytes]:
        return _ShellSession(self.owner)


class _ShellSession(asyncssh.SSHServerSession[bytes]):
    """One shell: channel input to the PTY, PTY output to the channel, sizes to the PTY."""

    def __init__(self, owner: SshShellServer) -> None:
        self.owner = owner
        self.chan: Any = None
        self.term = "xterm-256color"
        self.size = DEFAULT_SIZE
        self.master: int | None = None
        self.input: asyncio.Queue[bytes | None] = asyncio.Queue()
        """Client input for the PTY; None once the client's input ended."""
        self.queued = 0
        self.writable = asyncio.Event()
        self.writable.set()
        self.task: asyncio.Task[None] | None = None

    def connection_made(self, chan: Any) -> None:
        self.chan = chan

    def pty_requested(
        self, term_type: str, term_size: tuple[int, int, int, int], modes: Any
    ) -> bool:
        self.term = term_type or self.term
        self.size = (term_size[0] or DEFAULT_SIZE[0], term_size[1] or DEFAULT_SIZE[1])
        return True

    def shell_requested(self) -> bool:
        return True

    def session_started(self) -> None:
        self.owner._sessions.add(self)
        self.task = asyncio.create_task(self._run())

    def terminal_size_changed(self, width: int, height: int, pixwidth: int, pixheight: int) -> None:
        self.size = (width, height)
        if self.master is not None:
            _set_size(self.master, self.size)

    def data_received(self, data: bytes, datatype: asyncssh.DataType) -> None:
        self._queue(data)

    def eof_received(self) -> bool:
        self.input.put_nowait(None)  # after what was typed: then Ctrl+D, as often as it takes
        return True

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.writable.set()
        if self.task is not None:
            self.task.cancel()

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.wait([self.task])

    def _queue(self, data: bytes) -> None:
        self.input.put_nowait(data)
        self.queued += len(data)
        if self.queued > HIGH_WATER:
            self.chan.pause_reading()

    async def _run(self) -> None:
        master, follower = pty.openpty()
        self.master = master
        _set_size(master, self.size)
        try:
            proc = await shells.spawn(
                self.owner.shell,
                tty=follower,
                home=self.owner.home,
                inputrc=self.owner.inputrc,
                term=self.term,
            )
        finally:
            os.close(follower)
        status: int | None = None
        try:
            await self._relay(master)
            status = await proc.wait()
        finally:
            self.master = None
            os.close(master)
            await shells.hang_up(proc)
            self.owner._sessions.discard(self)
            self._exit(status if status is not None else proc.returncode)

    async def _relay(self, master: int) -> None:
        output, tty_in = await shells.pty_streams(master)
        end_of_input = shells.EndOfInput(master, tty_in)
        feeding = asyncio.create_task(self._feed(tty_in, end_of_input))
        try:
            with contextlib.suppress(OSError):  # a PTY whose shell exited reads as EIO
                while data := await output.read(65536):
                    self.chan.write(data)
                    end_of_input.output_seen()
                    await self.writable.wait()
        finally:
            feeding.cancel()
            await asyncio.wait([feeding])
            tty_in.close()

    async def _feed(self, tty_in: shells.PtyInput, end_of_input: shells.EndOfInput) -> None:
        with contextlib.suppress(OSError):
            while (data := await self.input.get()) is not None:
                tty_in.write(data)
                await tty_in.drain()
                self.queued -= len(data)
                if self.queued <= HIGH_WATER // 2:
                    self.chan.resume_reading()
            end_of_input.client_closed()
            await tty_in.drain()

    def _exit(self, status: int | None) -> None:
        with contextlib.suppress(OSError, asyncssh.Error):
            if status is not None and status < 0:
                self.chan.exit_with_signal(signal.Signals(-status).name.removeprefix("SIG"))
            else:
                self.chan.exit(status or 0)


def _set_size(tty: int, size: tuple[int, int]) -> None:
    """Give the PTY `size` (columns, rows); the kernel tells the shell with SIGWINCH."""
    with contextlib.suppress(OSError):
        fcntl.ioctl(tty, termios.TIOCSWINSZ, struct.pack("HHHH", size[1], size[0], 0, 0))
