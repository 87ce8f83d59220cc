"""One SSH channel as a `ByteStream`: a console session with a PTY, or a direct-tcpip forward.

asyncssh calls the session object (data, EOF, loss, exit status, window
changes through pause/resume); the pump calls `read`, `write`, `write_eof`
and `close`. Reading pauses the channel while more than `high_water` bytes
wait, so a slow client stalls the SSH server instead of growing our memory;
writing waits while the channel's window (or buffer) is full.

A console also takes terminal sizes (`resize` becomes an SSH window-change)
and keeps the command's exit status: `exit_code` is set when the server
reports one, 128 + the signal number when the command was killed by a
signal (as a shell reports it), and stays None when the server said neither.
`failure` says why the channel ended if it did not end cleanly (the SSH
connection was lost); `read` then raises `ConnectionResetError` with it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import signal
from collections.abc import Callable
from typing import Any

import asyncssh

from subres.engine import internals
from subres.protocol.channels import TerminalSize

__all__ = ["EOT", "ChannelStream", "ConsoleStream", "ForwardStream"]

log = logging.getLogger(__name__)

# A changed asyncssh stops the server when it loads the SSH backend, not on a live forward.
internals.check_asyncssh()

CLOSE_GRACE = 5.0
"""Seconds a closing channel may take before the connection stops waiting for it."""
EOT = b"\x04"
"""Ctrl+D: what a terminal sends for end of input; a PTY has no other way to see EOF."""


class ChannelStream:
    """The state and `ByteStream` methods shared by console and forward channels."""

    def __init__(self, *, high_water: int, release: Callable[[], None]) -> None:
        self._high_water = high_water
        self._release: Callable[[], None] | None = release
        self._chan: Any = None
        """asyncssh's SSHClientChannel or SSHTCPChannel."""
        self._chunks: collections.deque[bytes] = collections.deque()
        self._size = 0
        self._eof = False
        self._read_paused = False
        self._write_paused = False
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()
        self._closed = asyncio.Event()
        self.failure = ""
        """Why the channel ended, when it was not a clean close (empty otherwise)."""

    # asyncssh's side -------------------------------------------------------

    def connection_made(self, chan: Any) -> None:
        """Keep the channel."""
        self._chan = chan

    def data_received(self, data: bytes, datatype: asyncssh.DataType) -> None:
        """Queue output (stderr too: a console shows both); pause when too much waits."""
        self._chunks.append(data)
        self._size += len(data)
        if self._size > self._high_water and not self._read_paused and self._chan is not None:
            self._chan.pause_reading()
            self._read_paused = True
        self._readable.set()

    def eof_received(self) -> bool:
        """The server sends no more; keep our side open for what we still write."""
        self._eof = True
        self._readable.set()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        """The channel closed (or the connection under it died): wake everyone."""
        if exc is not None:
            self.failure = f"the SSH connection was lost: {exc}"
        self._eof = True
        self._readable.set()
        self._writable.set()
        self._closed.set()
        self._give_back()

    def pause_writing(self) -> None:
        """The channel's window or buffer is full."""
        self._writable.clear()

    def resume_writing(self) -> None:
        """There is room again."""
        self._writable.set()

    # the pump's side ---------------------------------------------------------

    async def read(self) -> bytes:
        """The next chunk; b"" once the server sent EOF or the channel closed cleanly.

        A lost connection raises `ConnectionResetError` saying so: the session
        then ends as a backend failure (1011 with that reason), not as a clean end.
        """
        while not self._chunks:
            if self.failure:
                raise ConnectionResetError(self.failure)
            if self._eof:
                return b""
            self._readable.clear()
            await self._readable.wait()
        data = self._chunks.popleft()
        self._size -= len(data)
        if self._read_paused and self._size <= self._high_water // 2 and self._chan is not None:
            self._read_paused = False
            self._chan.resume_reading()
        return data

    async def write(self, data: bytes) -> None:
        """Send `data`, then wait while the channel cannot take more."""
        if self._chan is None or self._closed.is_set():
            raise ConnectionResetError(self.failure or "the SSH channel is closed")
        self._chan.write(data)
        await self._writable.wait()
        if self._closed.is_set() and self.failure:
            raise ConnectionResetError(self.failure)

    async def write_eof(self) -> None:
        """Tell the server we send no more."""
        if self._chan is not None and not self._closed.is_set():
            with contextlib.suppress(OSError, asyncssh.Error):
                self._chan.write_eof()

    async def close(self) -> None:
        """Close the channel (not the shared connection) and give the connection back."""
        if self._chan is not None and not self._closed.is_set():
            self._chan.close()
            try:
                async with asyncio.timeout(CLOSE_GRACE):
                    await self._closed.wait()
            except TimeoutError:
                log.info("SSH channel did not close within %gs", CLOSE_GRACE)
        self._give_back()

    def _give_back(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()

    def send_window(self) -> int | None:
        """How many bytes the server lets us send now (None when asyncssh does not say)."""
        return internals.send_window(self._chan)


class ForwardStream(ChannelStream, asyncssh.SSHTCPSession[bytes]):
    """A direct-tcpip channel: bytes to and from a TCP port as seen by the SSH server."""


class ConsoleStream(ChannelStream, asyncssh.SSHClientSession[bytes]):
    """A session channel with a PTY: a login shell or a configured command."""

    def __init__(self, *, high_water: int, release: Callable[[], None]) -> None:
        super().__init__(high_water=high_water, release=release)
        self.exit_code: int | None = None
        """The command's exit status (128 + signal number when a signal ended it)."""

    async def read(self) -> bytes:
        """The next chunk; b"" once the channel closed, when the exit status is known.

        A server sends EOF before the exit status and the close; the session
        ends when the command does, so that its status can be reported.
        """
        data = await super().read()
        if not data:
            await self._closed.wait()
            if self.failure:
                raise ConnectionResetError(self.failure)
        return data

    def exit_status_received(self, status: int) -> None:
        """The command exited."""
        self.exit_code = status

    def exit_signal_received(self, signal: str, core_dumped: bool, msg: str, lang: str) -> None:
        """A signal ended the command: a shell would say 128 + its number."""
        self.exit_code = 128 + _signal_number(signal)
        log.info("console command ended by SIG%s%s", signal, f": {msg}" if msg else "")

    async def write_eof(self) -> None:
        """Input ended: a terminal says so with Ctrl+D, then the channel half-closes."""
        if self._chan is not None and not self._closed.is_set():
            with contextlib.suppress(OSError, asyncssh.Error):
                self._chan.write(EOT)
        await super().write_eof()

    def resize(self, size: TerminalSize) -> None:
        """The client's terminal changed size: an SSH window-change request (sent, not awaited)."""
        chan = self._chan
        if chan is None or self._closed.is_set() or not size.width or not size.height:
            return
        with contextlib.suppress(OSError, asyncssh.Error):
            chan.change_terminal_size(size.width, size.height)


def _signal_number(name: str) -> int:
    """`TERM` → 15; a name this system does not know counts as 0 (so 128 in all)."""
    try:
        return int(signal.Signals[f"SIG{name}"])
    except KeyError:
        return 0
