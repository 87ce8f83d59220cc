"""A shell in a PTY behind a unix socket, and the PTY parts the demo's SSH console shares.

Each connection gets a fresh shell. Bytes from the socket go to the PTY;
the PTY's output goes back. When the client half-closes, the shell is sent
EOF (Ctrl+D, as often as it takes: see `EndOfInput`) so piped scripts end;
when the shell exits, the socket closes. `subres demo` serves its shell
through `subres.demo.sshd` (a socket carries no window size); this server is
the serial console of the tests' KubeVirt-style machines.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pty
import signal
import sys
import termios
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "EOT",
    "EndOfInput",
    "PtyInput",
    "ShellServer",
    "hang_up",
    "pty_streams",
    "spawn",
    "write_inputrc",
]

log = logging.getLogger(__name__)

EOT = b"\x04"
_CONTROLLING_TTY = "import os, sys; os.login_tty(0); os.execvp(sys.argv[1], sys.argv[1:])"
"""Run with the PTY as stdin: a new session whose controlling terminal it is, then argv."""
INPUTRC = """\
# The demo console's readline: yours, minus bracketed paste, whose escape codes
# would clutter every output read through a pipe (`echo 'uname -a' | subres console`).
{includes}set enable-bracketed-paste off
"""


class ShellServer:
    """A unix-socket server that runs `shell` in a PTY per connection."""

    def __init__(self, path: Path, *, shell: str = "/bin/sh") -> None:
        self.path = path
        self.shell = shell
        self.home = os.path.expanduser("~")
        self.inputrc = path.with_name("inputrc")
        self._server: asyncio.Server | None = None
        self._sessions: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Listen on the socket path (replacing a stale socket)."""
        write_inputrc(self.inputrc, home=self.home)
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
        try:
            proc = await spawn(self.shell, tty=slave, home=self.home, inputrc=self.inputrc)
        finally:
            os.close(slave)
        try:
            await _relay(master, reader, writer)
        finally:
            os.close(master)
            await hang_up(proc)


def write_inputrc(path: Path, *, home: str) -> None:
    """The demo shell's readline settings: the user's, bracketed paste off."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    includes = [Path("/etc/inputrc"), Path(home, ".inputrc")]
    path.write_text(
        INPUTRC.format(includes="".join(f"$include {p}\n" for p in includes if p.is_file()))
    )


async def spawn(
    shell: str, *, tty: int, home: str, inputrc: Path, term: str = "xterm-256color"
) -> asyncio.subprocess.Process:
    """An interactive `shell` on the PTY follower `tty`, in a session of its own.

    The PTY must be the session's controlling terminal, or the shell turns job
    control off and says so (`/bin/sh: 0: can't access tty`) at every start:
    a small Python program makes it so (`os.login_tty`) and then becomes the
    shell, which a `preexec_fn` would do in a forked child of this threaded
    process, where that is unsafe.
    """
    env = {**os.environ, "TERM": term, "PS1": "demo$ ", "INPUTRC": str(inputrc)}
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-I",
        "-S",
        "-c",
        _CONTROLLING_TTY,
        shell,
        "-i",
        stdin=tty,
        stdout=tty,
        stderr=tty,
        env=env,
        cwd=home,
    )


async def pty_streams(master: int) -> tuple[asyncio.StreamReader, PtyInput]:
    """A reader of the shell's output and a writer of its input, over the PTY leader.

    The reader uses a duplicate of `master`, which the caller still closes.
    """
    loop = asyncio.get_running_loop()
    tty_out = asyncio.StreamReader(limit=1 << 17)
    await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(tty_out), os.fdopen(os.dup(master), "rb", 0)
    )
    return tty_out, PtyInput(os.dup(master))


class PtyInput:
    """What is typed into the PTY: written when the leader takes it, with `drain`.

    Not a write-pipe transport: uvloop's reads its pipe to notice the far end
    closing, and on a PTY leader that read takes the shell's output.
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        os.set_blocking(fd, False)
        self._pending = bytearray()
        self._drained: asyncio.Future[None] | None = None
        self._loop = asyncio.get_running_loop()
        self._closed = False

    def write(self, data: bytes) -> None:
        """Type `data` (what the PTY does not take now waits for it)."""
        if self._closed:
            raise BrokenPipeError("the PTY input is closed")
        if not self._pending:
            with contextlib.suppress(BlockingIOError):
                data = data[os.write(self._fd, data) :]
            if not data:
                return
            self._loop.add_writer(self._fd, self._flush)
        self._pending += data

    def _flush(self) -> None:
        try:
            del self._pending[: os.write(self._fd, self._pending)]
        except BlockingIOError:
            return
        except OSError as exc:
            self._pending.clear()
            self._wake(exc)
            return
        if not self._pending:
            self._wake(None)

    def _wake(self, exc: OSError | None) -> None:
        self._loop.remove_writer(self._fd)
        if self._drained is not None and not self._drained.done():
            if exc is None:
                self._drained.set_result(None)
            else:
                self._drained.set_exception(exc)

    async def drain(self) -> None:
        """Wait until the PTY took everything written."""
        if self._pending:
            self._drained = self._loop.create_future()
            await self._drained

    def close(self) -> None:
        """Stop typing; what was not taken is dropped."""
        if not self._closed:
            self._closed = True
            if self._pending:
                self._pending.clear()
                self._wake(None)
            os.close(self._fd)


async def _relay(master: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    tty_out, tty_in = await pty_streams(master)
    end_of_input = EndOfInput(master, tty_in)
    up = asyncio.create_task(_copy(reader, tty_in, at_end=end_of_input.client_closed))
    try:
        await _copy(tty_out, writer, each=end_of_input.output_seen)
    finally:
        up.cancel()
        await asyncio.wait([up])
        tty_in.close()


class EndOfInput:
    """Ctrl+D typed for a client that closed its input, until the shell has read it as EOF.

    One Ctrl+D is not always enough. The terminal turns it into end-of-file
    only in canonical mode; bash's readline switches canonical mode off while
    it waits at its prompt and reads Ctrl+D as a key, and a Ctrl+D typed while
    the terminal was canonical (bash still starting, or running a command)
    reaches readline as a NUL it ignores: `echo 'uname -a' | subres console
    demo` hung forever under bash. So after the client's EOF, Ctrl+D is typed
    once more whenever the output shows the terminal non-canonical again
    (readline switches before it draws its prompt); sh, always canonical,
    reads the first one.
    """

    def __init__(self, master: int, tty_in: PtyInput) -> None:
        self._master = master
        self._tty_in = tty_in
        self._closed = False
        self._typed_raw = False
        """Ctrl+D was typed since the terminal last left canonical mode."""

    def client_closed(self) -> None:
        """The client sent EOF: type Ctrl+D now."""
        self._closed = True
        self._typed_raw = not self._canonical()
        self._tty_in.write(EOT)

    def output_seen(self) -> None:
        """The shell wrote something: type Ctrl+D again if it may be waiting at a prompt."""
        if not self._closed:
            return
        if self._canonical():
            self._typed_raw = False
        elif not self._typed_raw:
            self._typed_raw = True
            self._tty_in.write(EOT)

    def _canonical(self) -> bool:
        try:
            return bool(termios.tcgetattr(self._master)[3] & termios.ICANON)
        except termios.error:  # the shell is gone
            return True


def _nothing() -> None:
    pass


async def _copy(
    src: asyncio.StreamReader,
    dst: asyncio.StreamWriter | PtyInput,
    *,
    each: Callable[[], None] = _nothing,
    at_end: Callable[[], None] = _nothing,
) -> None:
    """Copy until EOF (a PTY whose shell exited reads as EIO); `each` after every chunk
    written, `at_end` once the source ended."""
    with contextlib.suppress(OSError):
        while data := await src.read(65536):
            dst.write(data)
            each()
            await dst.drain()
        at_end()
        await dst.drain()


async def hang_up(proc: asyncio.subprocess.Process) -> None:
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
