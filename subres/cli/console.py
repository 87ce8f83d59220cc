"""`subres console`: a machine's serial console in the local terminal, like `virtctl console`.

Owns the verb's flags, the WebSocket connection to the `console` subresource
(Kubernetes channel subprotocols v5 then v4, retried while the machine is not
running), and the session: stdin up, stdout and stderr down, the terminal size
on the resize channel, Ctrl+] to leave, and the exit code from how the server
ended the session. When the server goes away (1001) or the connection is
lost, it connects again by itself and says so (`subres.cli.reconnect`).
`--observe` watches through `console-observe` instead: stdin only ever
looks for Ctrl+]. In a terminal, it first asks before taking the console
from someone who writes on it (`subres.cli.takeover`; `--force` does not).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import json
import os
import signal
import sys
import time
from typing import BinaryIO
from urllib.parse import urlencode

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from subres.cli import api, kubeconfig, reconnect, takeover, terminal, timeleft
from subres.cli.api import CommandError, ServerError, Target
from subres.cli.kubeconfig import ClientConfig
from subres.protocol import channels
from subres.protocol.channels import ChannelData, Dialect

__all__ = ["SUBPROTOCOLS", "main"]

SUBPROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")
"""Offered in this order: v5 can tell the server that stdin ended."""
ESCAPE = b"\x1d"
"""Ctrl+]: leaves an interactive session, as in telnet and virtctl."""
READ_SIZE = 65536
MAX_MESSAGE = 4 * 1024 * 1024
"""Largest message accepted from the server; servers send one backend read per message."""
CLOSE_TIMEOUT = 2.0
RETRY_CODES = frozenset({409, 503})
"""Not running yet, backend not reachable yet: worth waiting for with `--timeout`."""
NORMAL_CLOSURE = 1000


@api.command
def main(ns: argparse.Namespace) -> int:
    """Run a console session; the exit code."""
    typed = api.parse_target(ns.target)
    config = kubeconfig.from_args(ns)
    return asyncio.run(_console(config, typed, group_version=ns.api_group_version, ns=ns))


async def _console(
    config: ClientConfig, typed: api.TargetText, *, group_version: str, ns: argparse.Namespace
) -> int:
    target = await api.resolve(
        typed, config, group_version=group_version, namespace_flag=ns.namespace
    )
    if ns.end and not ns.moderate:
        raise CommandError("--end ends a moderated session: it goes with --moderate")
    if ns.end:
        plain = api.object_url(config, target, group_version=group_version, websocket=False)
        return await _end(config, f"{plain}/console-moderate", target)
    fd = sys.stdin.fileno()
    interactive = os.isatty(fd)
    observe = ns.observe or ns.moderate
    if interactive and not observe and not ns.force:
        chosen = await takeover.ask(
            config, target, group_version=group_version, console=ns.console or ""
        )
        observe = chosen == takeover.OBSERVER
    sub = "console-moderate" if ns.moderate else "console-observe" if observe else "console"
    options = {"tail": ns.tail, "console": ns.console}
    query = urlencode({k: v for k, v in options.items() if v is not None})
    address = api.object_url(config, target, group_version=group_version) + f"/{sub}"
    address += f"?{query}" if query else ""
    ws = await _connect(config, address=address, target=target, retry_for=ns.timeout)
    if interactive:
        how = (
            "Moderating" if ns.moderate else "Observing (read-only)" if observe else "Connected to"
        )
        which = f" (console {ns.console})" if ns.console else ""
        print(f"{how} {target}{which}. Escape with Ctrl+]", file=sys.stderr, flush=True)
    loop = asyncio.get_running_loop()
    pacing = reconnect.Pacing()
    stdout = _Output(sys.stdout.buffer)
    with terminal.raw_mode(fd) if interactive else contextlib.nullcontext():
        while True:
            started = loop.time()
            try:
                session = _Session(
                    ws,
                    _dialect(ws),
                    fd=fd,
                    interactive=interactive,
                    observe=observe,
                    stdout=stdout,
                    target=str(target),
                )
                code = await session.run(may_reconnect=ns.reconnect)
            finally:
                await ws.close()
                if interactive and not stdout.at_line_start:
                    # What we say next (taken over, an error) starts a line of its own.
                    await stdout.write(b"\r\n")
            if code is not None:
                return code
            _say(f"{target}: {session.dropped}; reconnecting", interactive=interactive)
            left = await pacing.next(lasted=loop.time() - started)
            if left <= 0:
                raise CommandError(f"{target}: {session.dropped}; gave up reconnecting")
            ws = await _reconnect(config, address=address, target=target, within=left)
            _say(f"Reconnected to {target}.", interactive=interactive)


async def _end(config: ClientConfig, url: str, target: Target) -> int:
    """End the moderated console session of `target`; 0, the server's words on stderr."""
    body = await api.get(config, url, max_body=1 << 16, target=target, method="DELETE")
    print(api.json_object(body).get("message") or "ended", file=sys.stderr)
    return 0


def _dialect(ws: ClientConnection) -> Dialect:
    dialect = channels.negotiate([ws.subprotocol or ""], SUBPROTOCOLS)
    if dialect is None:
        raise CommandError(f"the server agreed to none of {', '.join(SUBPROTOCOLS)}")
    return dialect


def _say(line: str, *, interactive: bool) -> None:
    # A raw-mode terminal does not return the carriage on a newline.
    end = "\r\n" if interactive else "\n"
    print(line, end=end, file=sys.stderr, flush=True)


async def _connect(
    config: ClientConfig, *, address: str, target: Target, retry_for: float
) -> ClientConnection:
    """Open the WebSocket; retry 409 and 503 answers with backoff for `retry_for` seconds."""

    def worth_it(exc: CommandError) -> bool:
        if not isinstance(exc, ServerError) or exc.code not in RETRY_CODES:
            return False
        if retry_for == 0 and not exc.hint:
            exc.hint = "hint: --timeout 5m waits for it to become available"
        return True

    def waiting(exc: CommandError) -> None:
        message = exc.message if isinstance(exc, ServerError) else str(exc)
        print(f"{target}: {message}; waiting", file=sys.stderr, flush=True)

    return await reconnect.retrying(
        lambda: _open(config, address=address, target=target),
        within=retry_for,
        worth_it=worth_it,
        waiting=waiting,
    )


async def _reconnect(
    config: ClientConfig, *, address: str, target: Target, within: float
) -> ClientConnection:
    """Open the WebSocket again, through a server restarting or another replica."""
    return await reconnect.retrying(
        lambda: _open(config, address=address, target=target),
        within=within,
        worth_it=reconnect.worth_reconnecting,
    )


async def _open(config: ClientConfig, *, address: str, target: Target) -> ClientConnection:
    return await api.connect(
        config,
        address,
        target=target,
        subprotocols=SUBPROTOCOLS,
        max_size=MAX_MESSAGE,
        close_timeout=CLOSE_TIMEOUT,
    )


class _Stdin:
    """stdin as an async source of chunks; b"" at its end."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._pollable = True

    async def read(self) -> bytes:
        if self._pollable:
            try:
                await self._readable()
            except PermissionError:
                # epoll refuses regular files and /dev/null; reading them never blocks.
                self._pollable = False
        try:
            return os.read(self._fd, READ_SIZE)
        except OSError as exc:
            if exc.errno == errno.EIO:  # the terminal hung up
                return b""
            raise

    async def _readable(self) -> None:
        # The fd stays blocking (it is often shared with the shell's stdout); a read
        # after readiness returns what is there without waiting.
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()
        loop.add_reader(self._fd, _resolve, ready)
        try:
            await ready
        finally:
            loop.remove_reader(self._fd)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class _Output:
    """A binary stream written off the loop, one chunk at a time (that is the backpressure)."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self.at_line_start = True
        """Nothing was written yet, or the last byte ended a line."""

    async def write(self, data: bytes) -> None:
        try:
            await asyncio.to_thread(self._write, data)
        except OSError as exc:
            raise CommandError(f"cannot write output: {exc}") from None

    def _write(self, data: bytes) -> None:
        self._stream.write(data)
        self._stream.flush()
        if data:
            self.at_line_start = data.endswith(b"\n")


class _Session:
    """One connected console: pumps both ways and decides the exit code."""

    def __init__(
        self,
        ws: ClientConnection,
        dialect: Dialect,
        *,
        fd: int,
        interactive: bool,
        observe: bool = False,
        stdout: _Output | None = None,
        target: str = "",
    ) -> None:
        self._ws = ws
        self._target = target
        self._dialect = dialect
        self._fd = fd
        self._interactive = interactive
        self._observe = observe
        self._stdin = _Stdin(fd)
        self._stdout = stdout or _Output(sys.stdout.buffer)
        self._stderr = _Output(sys.stderr.buffer)
        self._status = bytearray()
        self._typed = time.monotonic()
        self.dropped = ""
        """Why the session ended in a way worth reconnecting after (see `run`)."""

    async def run(self, *, may_reconnect: bool) -> int | None:
        """Pump until the server closes, or the user escapes or a signal stops us.

        The exit code; with `may_reconnect`, None when the server went away
        or the connection was lost (`dropped` says which).
        """
        stopped = asyncio.Event()
        up = asyncio.create_task(self._up())
        down = asyncio.create_task(self._down())
        stop = asyncio.create_task(stopped.wait())
        tasks = {up, down, stop, asyncio.create_task(self._time_left())}
        if self._interactive:
            tasks.add(asyncio.create_task(self._resize()))
        try:
            with terminal.on_signals((signal.SIGTERM, signal.SIGHUP), stopped.set):
                await asyncio.wait({up, down, stop}, return_when=asyncio.FIRST_COMPLETED)
                if up.done() and up.result():
                    return 0
                # stdin ended (or the server is closing): output flows until the server is done.
                await asyncio.wait({down, stop}, return_when=asyncio.FIRST_COMPLETED)
                if stop.done():
                    raise CommandError("stopped by a signal")
                down.result()
            if may_reconnect and self._failure() is None:
                self.dropped = _dropped(self._ws) or ""
                if self.dropped:
                    return None
            return self._outcome()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks)

    async def _time_left(self) -> None:
        """Say how long the session has left once a limit of the server's is near."""
        response = self._ws.response
        if response is None:
            return
        await timeleft.watch(
            response.headers,
            say=lambda line: _say(f"{self._target}: {line}", interactive=self._interactive),
            last_input=None if self._observe else lambda: self._typed,
        )

    async def _up(self) -> bool:
        """Copy stdin to the server; True when the user pressed the escape key."""
        try:
            while data := await self._stdin.read():
                if self._interactive and ESCAPE in data:
                    before = data[: data.index(ESCAPE)]
                    if before and not self._observe:
                        await self._send(channels.STDIN, before)
                    return True
                if not self._observe:
                    await self._send(channels.STDIN, data)
                    self._typed = time.monotonic()
            if self._dialect.close_signal:
                await self._ws.send(bytes((channels.CLOSE_SIGNAL, channels.STDIN)))
        except ConnectionClosed:
            pass
        # On v4 the server cannot be told; output keeps flowing until it closes.
        return False

    async def _down(self) -> None:
        """Copy the server's output to ours until it closes the connection."""
        while True:
            try:
                message = await self._ws.recv()
            except ConnectionClosed:
                return
            try:
                event = channels.decode(self._dialect, message)
            except channels.ChannelError as exc:
                raise CommandError(f"malformed message from the server: {exc}") from None
            if isinstance(event, ChannelData):
                await self._deliver(event)

    async def _deliver(self, event: ChannelData) -> None:
        if event.channel == channels.STDOUT:
            await self._stdout.write(event.data)
        elif event.channel == channels.STDERR:
            await self._stderr.write(event.data)
        elif event.channel == channels.ERROR:
            self._status += event.data
            status = api.json_object(self._status)
            if status and status.get("status") != "Success":
                # The session failed: do not wait for a server that fails to hang up after it.
                await self._ws.close()

    async def _resize(self) -> None:
        """Send the terminal size now and after every SIGWINCH."""
        changed = asyncio.Event()
        try:
            with terminal.on_signals((signal.SIGWINCH,), changed.set):
                while True:
                    size = terminal.size(self._fd)
                    message = {"Width": size.width, "Height": size.height}
                    await self._send(channels.RESIZE, json.dumps(message).encode())
                    await changed.wait()
                    changed.clear()
        except ConnectionClosed:
            pass

    async def _send(self, channel: int, data: bytes) -> None:
        await self._ws.send(channels.encode(self._dialect, channel, data))

    def _outcome(self) -> int:
        """0 for a clean end; raises with the server's words otherwise."""
        failure = self._failure()
        if failure is not None:
            error = CommandError(failure)
            # As `kubectl exec`: the remote command's exit status becomes ours.
            error.exit_code = _exit_code(api.json_object(self._status)) or 1
            raise error
        code = self._ws.close_code
        if code == NORMAL_CLOSURE:
            return 0
        reason = self._ws.close_reason or "no reason given"
        if code is None or code == 1006:
            raise CommandError("lost the connection to the server")
        raise CommandError(f"the server closed the console ({code}): {reason}")

    def _failure(self) -> str | None:
        """The message of a non-Success `Status` on the error channel."""
        if not self._status:
            return None
        status = api.json_object(self._status)
        if not status:
            return self._status.decode("utf-8", "replace")
        if status.get("status") == "Success":
            return None
        return str(status.get("message") or status.get("reason") or "the session failed")


def _exit_code(status: dict[str, object]) -> int | None:
    """The exit status a `NonZeroExitCode` Status carries (its `ExitCode` cause), if any."""
    details = status.get("details")
    causes = details.get("causes") if isinstance(details, dict) else None
    for cause in causes if isinstance(causes, list) else []:
        if isinstance(cause, dict) and cause.get("reason") == "ExitCode":
            text = str(cause.get("message", ""))
            if text.isdigit() and 0 < int(text) < 256:
                return int(text)
    return None


def _dropped(ws: ClientConnection) -> str | None:
    return reconnect.dropped(ws.close_code, ws.close_reason)
