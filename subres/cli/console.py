"""`subres console`: a machine's serial console in the local terminal, like `virtctl console`.

Owns the verb's flags, the WebSocket connection to the `console` subresource
(Kubernetes channel subprotocols v5 then v4, retried while the machine is not
running), and the session: stdin up, stdout and stderr down, the terminal size
on the resize channel, Ctrl+] to leave, and the exit code from how the server
ended the session. When the server goes away (1001) or the connection is
lost, it connects again by itself and says so (`subres.cli.reconnect`).
`--observe` watches through `console-observe` instead: stdin only ever
looks for Ctrl+]; `--moderate` through `console-moderate`, which a moderated
writer waits for (`--moderate --end` ends that writer's session). In a
terminal, it first asks before taking the console from someone who writes on
it (`subres.cli.takeover`; `--force` does not). Under a server's limits it
says how long is left once it is short (`subres.cli.timeleft`). A kept
console replays its scrollback to whoever attaches; a script piped in
(stdin not a terminal) asks for none (`?tail=0`) unless `--tail` says how
much, so its output is its own, not earlier sessions'.
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

from websockets.exceptions import ConnectionClosed

from subres.cli import api, kubeconfig, reconnect, takeover, terminal, timeleft
from subres.cli.api import CommandError, ServerError, Target
from subres.cli.kubeconfig import ClientConfig
from subres.engine.pump import Traffic, pump
from subres.engine.wsclient import ClientWebSocket
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
    tail = ns.tail if ns.tail is not None or interactive else 0
    options = {"tail": tail, "console": ns.console}
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
            ws = await _reconnect(
                config, address=address, target=target, within=left, interactive=interactive
            )
            _say(f"Reconnected to {target}.", interactive=interactive)


async def _end(config: ClientConfig, url: str, target: Target) -> int:
    """End the moderated console session of `target`; 0, the server's words on stderr."""
    body = await api.get(config, url, max_body=1 << 16, target=target, method="DELETE")
    print(api.json_object(body).get("message") or "ended", file=sys.stderr)
    return 0


def _dialect(ws: ClientWebSocket) -> Dialect:
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
) -> ClientWebSocket:
    """Open the WebSocket; retry 409 and 503 answers with backoff for `retry_for` seconds,
    and 401 and 403 while kube-apiserver is not ready (`reconnect.worth_reconnecting`)."""

    async def worth_it(exc: CommandError) -> bool:
        if not isinstance(exc, ServerError):
            return False
        if exc.code in reconnect.DENIALS and retry_for > 0:
            return not await reconnect.apiserver_ready(config)
        if exc.code not in RETRY_CODES:
            return False
        if retry_for == 0 and not exc.hint:
            exc.hint = "hint: --timeout 5m waits for it to become available"
        return True

    def waiting(exc: CommandError) -> None:
        message = exc.message if isinstance(exc, ServerError) else str(exc)
        if isinstance(exc, ServerError) and exc.code in reconnect.DENIALS:
            message += " (kube-apiserver is not ready yet)"
        print(f"{target}: {message}; waiting", file=sys.stderr, flush=True)

    return await reconnect.retrying(
        lambda: _open(config, address=address, target=target),
        within=retry_for,
        worth_it=worth_it,
        waiting=waiting,
    )


async def _reconnect(
    config: ClientConfig, *, address: str, target: Target, within: float, interactive: bool
) -> ClientWebSocket:
    """Open the WebSocket again, through a server restarting or another replica."""
    return await reconnect.retrying(
        lambda: _open(config, address=address, target=target),
        within=within,
        worth_it=reconnect.reconnecting(
            config, lambda line: _say(f"{target}: {line}", interactive=interactive)
        ),
    )


async def _open(config: ClientConfig, *, address: str, target: Target) -> ClientWebSocket:
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


class _Terminal:
    """The local side as the pump's client: stdin up, the console's output down.

    Ctrl+] (interactive only) ends it: what came before it still goes up.
    After stdin's end a read waits until the pump stops it.
    """

    def __init__(self, fd: int, *, interactive: bool, stdout: _Output) -> None:
        self._stdin = _Stdin(fd)
        self._stdout = stdout
        self._interactive = interactive
        self._ended = False
        self.escaped = False
        self.typed = time.monotonic()
        """When the user last typed (monotonic), for the server's idle timeout."""

    @property
    def gone(self) -> bool:
        return self.escaped

    async def read(self) -> bytes:
        if self.escaped:
            return b""
        if self._ended:
            await asyncio.get_running_loop().create_future()
        data = await self._stdin.read()
        if not data:
            self._ended = True
        elif self._interactive and ESCAPE in data:
            self.escaped = True
            data = data[: data.index(ESCAPE)]
        if data:
            self.typed = time.monotonic()
        return data

    async def write(self, data: bytes) -> None:
        await self._stdout.write(data)

    async def write_eof(self) -> None:
        pass  # the server's end decides the exit code

    async def abort(self, reason: str) -> None:
        pass  # the WebSocket's close code and the status say what happened

    async def close(self) -> None:
        pass


class _Upstream:
    """The console's WebSocket as the pump's backend, in a channel dialect.

    Reads return stdout; stderr is written as it comes and the error
    channel's Status kept. Writes go on stdin (dropped when observing, or
    once the server is closing: its end still comes through `read`).
    """

    def __init__(self, ws: ClientWebSocket, dialect: Dialect, *, observe: bool) -> None:
        self.ws = ws
        self.dialect = dialect
        self.status = bytearray()
        self._observe = observe
        self._stderr = _Output(sys.stderr.buffer)

    async def read(self) -> bytes:
        while True:
            try:
                message = await self.ws.recv()
            except ConnectionClosed:
                return b""
            try:
                event = channels.decode(self.dialect, message)
            except channels.ChannelError as exc:
                raise CommandError(f"malformed message from the server: {exc}") from None
            if not isinstance(event, ChannelData):
                continue
            if event.channel == channels.STDOUT and event.data:
                return event.data
            if event.channel == channels.STDERR:
                await self._stderr.write(event.data)
            elif event.channel == channels.ERROR:
                await self._failed(event.data)

    async def _failed(self, data: bytes) -> None:
        self.status += data
        status = api.json_object(self.status)
        if status and status.get("status") != "Success":
            # The session failed: do not wait for a server that fails to hang up after it.
            await self.ws.close()

    async def write(self, data: bytes) -> None:
        if not self._observe:
            await self.send(channels.STDIN, data)

    async def write_eof(self) -> None:
        # On v4 the server cannot be told; output keeps flowing until it closes.
        if self.dialect.close_signal and not self._observe:
            with contextlib.suppress(ConnectionClosed):
                await self.ws.send(bytes((channels.CLOSE_SIGNAL, channels.STDIN)))

    async def send(self, channel: int, data: bytes) -> None:
        with contextlib.suppress(ConnectionClosed):
            await self.ws.send(channels.encode(self.dialect, channel, data))

    async def close(self) -> None:
        await self.ws.close()


class _Session:
    """One connected console: pumps both ways and decides the exit code."""

    def __init__(
        self,
        ws: ClientWebSocket,
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
        self._observe = observe
        self._fd = fd
        self._interactive = interactive
        self._terminal = _Terminal(
            fd, interactive=interactive, stdout=stdout or _Output(sys.stdout.buffer)
        )
        self._upstream = _Upstream(ws, dialect, observe=observe)
        self.dropped = ""
        """Why the session ended in a way worth reconnecting after (see `run`)."""

    async def run(self, *, may_reconnect: bool) -> int | None:
        """Pump until the server closes, or the user escapes or a signal stops us.

        The exit code; with `may_reconnect`, None when the server went away
        or the connection was lost (`dropped` says which).
        """
        stopped = asyncio.Event()
        # Once the server ends, stdin is not waited for.
        session = asyncio.create_task(pump(self._terminal, self._upstream, Traffic(), grace=0))
        stop = asyncio.create_task(stopped.wait())
        tasks = {session, stop, asyncio.create_task(self._time_left())}
        if self._interactive:
            tasks.add(asyncio.create_task(self._resize()))
        try:
            with terminal.on_signals((signal.SIGTERM, signal.SIGHUP), stopped.set):
                await asyncio.wait({session, stop}, return_when=asyncio.FIRST_COMPLETED)
                if stop.done():
                    raise CommandError("stopped by a signal")
                session.result()
            if self._terminal.escaped:
                return 0
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
        local = self._terminal
        await timeleft.watch(
            dict(self._ws.headers),
            say=lambda line: _say(f"{self._target}: {line}", interactive=self._interactive),
            last_input=None if self._observe else lambda: local.typed,
        )

    async def _resize(self) -> None:
        """Send the terminal size now and after every SIGWINCH."""
        changed = asyncio.Event()
        with terminal.on_signals((signal.SIGWINCH,), changed.set):
            while True:
                size = terminal.size(self._fd)
                message = {"Width": size.width, "Height": size.height}
                await self._upstream.send(channels.RESIZE, json.dumps(message).encode())
                await changed.wait()
                changed.clear()

    def _outcome(self) -> int:
        """0 for a clean end; raises with the server's words otherwise."""
        failure = self._failure()
        if failure is not None:
            error = CommandError(failure)
            # As `kubectl exec`: the remote command's exit status becomes ours.
            error.exit_code = _exit_code(api.json_object(self._upstream.status)) or 1
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
        status_bytes = self._upstream.status
        if not status_bytes:
            return None
        status = api.json_object(status_bytes)
        if not status:
            return status_bytes.decode("utf-8", "replace")
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


def _dropped(ws: ClientWebSocket) -> str | None:
    return reconnect.dropped(ws.close_code, ws.close_reason)
