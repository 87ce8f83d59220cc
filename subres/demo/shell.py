"""The demo machine's serial console: a shell in a PTY behind a unix socket.

Each connection gets a fresh shell. Bytes from the socket go to the PTY;
the PTY's output goes back. When the client half-closes, the shell is sent
EOF (Ctrl+D) so piped scripts end; when the shell exits, the socket closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pty
import signal
from pathlib import Path

__all__ = ["ShellServer"]

log = logging.getLogger(__name__)

EOT = b"\x04"


class ShellServer:
    """A unix-socket server that runs `shell` in a PTY per connection."""

    def __init__(self, path: Path, *, shell: str = "/bin/sh") -> None:
        self.path = path
        self.shell = shell
        self.home = os.path.expanduser("~")
        self._server: asyncio.Server | None = None
        self._sessions: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Listen on the socket path (replacing a stale socket)."""
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self._server = await asyncio.start_unix_server(self._serve, path=str(self.path))
        os.chmod(self.path, 0o600)

    async def stop(self) -> None:
        """Stop listening and end every shell."""
        if self._server is not None:
            self._server.close()
        for task in list(self._sessions):
            task.cancel()
        if self._sessions:
            await asyncio.wait(self._sessions)
        if self._server is not None:
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._sessions.add(task)
        try:
            await self._session(reader, writer)
        finally:
            self._sessions.discard(task)
            writer.close()

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        master, slave = pty.openpty()
        env = {**os.environ, "TERM": "xterm-256color", "PS1": "demo$ "}
        try:
            proc = await asyncio.create_subprocess_exec(
                self.shell,
                "-i",
                stdin=slave,
                stdout=slave,
                stderr=slave,
                env=env,
                cwd=self.home,
                start_new_session=True,
            )
        finally:
            os.close(slave)
        try:
            await _relay(master, reader, writer)
        finally:
            os.close(master)
            await _end(proc)


async def _relay(master: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    loop = asyncio.get_running_loop()
    tty_out = asyncio.StreamReader(limit=1 << 17)
    await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(tty_out), os.fdopen(os.dup(master), "rb", 0)
    )
    transport, protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, os.fdopen(os.dup(master), "wb", 0)
    )
    tty_in = asyncio.StreamWriter(transport, protocol, None, loop)
    up = asyncio.create_task(_copy(reader, tty_in, eof=EOT))
    try:
        await _copy(tty_out, writer, eof=b"")
    finally:
        up.cancel()
        await asyncio.wait([up])
        tty_in.close()


async def _copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter, *, eof: bytes) -> None:
    """Copy until EOF (a PTY whose shell exited reads as EIO), then send `eof`."""
    with contextlib.suppress(OSError):
        while data := await src.read(65536):
            dst.write(data)
            await dst.drain()
        if eof:
            dst.write(eof)
            await dst.drain()


async def _end(proc: asyncio.subprocess.Process) -> None:
    """Hang up on the shell's session as a closed terminal would; kill it if it lingers."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGHUP)
    try:
        async with asyncio.timeout(2):
            await proc.wait()
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
