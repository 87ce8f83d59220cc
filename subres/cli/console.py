"""`subres console`: a machine's serial console in the local terminal, like `virtctl console`.

Owns the verb's flags, the WebSocket connection to the `console` subresource
(Kubernetes channel subprotocols v5 then v4, retried while the machine is not
running), and the session: stdin up, stdout and stderr down, the terminal size
on the resize channel, Ctrl+] to leave, and the exit code from how the server
ended the session.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import json
import os
import re
import signal
import sys
from dataclasses import dataclass
from typing import Any, BinaryIO
from urllib.parse import quote, urlsplit

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException
from websockets.http11 import Response
from websockets.typing import Subprotocol

from subres.cli import kubeconfig, terminal
from subres.cli.kubeconfig import ClientConfig
from subres.protocol import channels
from subres.protocol.channels import ChannelData, Dialect

__all__ = [
    "DEFAULT_GROUP_VERSION",
    "SUBPROTOCOLS",
    "ConsoleError",
    "Target",
    "add_arguments",
    "main",
    "parse_duration",
    "parse_target",
    "url",
]

SUBPROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")
"""Offered in this order: v5 can tell the server that stdin ended."""
DEFAULT_GROUP_VERSION = "subresources.subres.dev/v1alpha1"
ESCAPE = b"\x1d"
"""Ctrl+]: leaves an interactive session, as in telnet and virtctl."""
READ_SIZE = 65536
MAX_MESSAGE = 4 * 1024 * 1024
"""Largest message accepted from the server; servers send one backend read per message."""
OPEN_TIMEOUT = 30.0
CLOSE_TIMEOUT = 2.0
RETRY_CODES = frozenset({409, 503})
"""Not running yet, backend not reachable yet: worth waiting for with `--timeout`."""
FIRST_BACKOFF = 0.5
MAX_BACKOFF = 5.0
NORMAL_CLOSURE = 1000

_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|s|m|h)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


class ConsoleError(Exception):
    """Ends the command: printed as `error: …`, exit code 1."""


@dataclass(frozen=True)
class Target:
    """The object whose console to open: `kind/name` as typed, and the plural resource."""

    kind: str
    resource: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind}/{self.name}"


def parse_target(text: str) -> Target:
    """`NAME` or `KIND/NAME`; the kind defaults to `machine`."""
    kind, _, name = text.rpartition("/")
    kind = kind.lower() or "machine"
    if not name or "/" in kind:
        raise ConsoleError(f"expected NAME or KIND/NAME, got {text!r}")
    # Resources are plurals; a kind typed in the singular gets the English plural.
    resource = kind if kind.endswith("s") else kind + "s"
    return Target(kind=kind, resource=resource, name=name)


def parse_duration(text: str) -> float:
    """Seconds in a Go-style duration such as `30s`, `5m`, `1h30m` or `0`."""
    if text.strip() == "0":
        return 0.0
    parts = _DURATION.findall(text.strip())
    if not parts or "".join(n + u for n, u in parts) != text.strip():
        raise argparse.ArgumentTypeError(f"invalid duration {text!r} (try 30s, 5m or 1h)")
    return sum(float(number) * _UNIT_SECONDS[unit] for number, unit in parts)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `console` flags (the client connection flags are added by the caller)."""
    parser.add_argument("target", metavar="[machine/]NAME", help="the machine to connect to")
    parser.add_argument(
        "--timeout",
        type=parse_duration,
        default=0.0,
        metavar="DURATION",
        help="keep retrying this long while the machine is not running or its console "
        "is unavailable (e.g. 30s, 5m; default 0: no retry)",
    )
    parser.add_argument(
        "--api-group-version", default=DEFAULT_GROUP_VERSION, help=argparse.SUPPRESS
    )


def main(ns: argparse.Namespace) -> int:
    """Run a console session; the exit code."""
    try:
        target = parse_target(ns.target)
        config = kubeconfig.from_args(ns)
        address = url(config, group_version=ns.api_group_version, target=target)
        return asyncio.run(_console(config, address=address, target=target, retry_for=ns.timeout))
    except (kubeconfig.KubeconfigError, ConsoleError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def url(config: ClientConfig, *, group_version: str, target: Target) -> str:
    """The WebSocket URL of `target`'s console in `config`'s namespace."""
    parts = urlsplit(config.server)
    scheme = "wss" if parts.scheme == "https" else "ws"
    path = "/".join(
        quote(segment, safe="")
        for segment in ("namespaces", config.namespace, target.resource, target.name, "console")
    )
    return f"{scheme}://{parts.netloc}{parts.path.rstrip('/')}/apis/{group_version}/{path}"


async def _console(config: ClientConfig, *, address: str, target: Target, retry_for: float) -> int:
    ws = await _connect(config, address=address, target=target, retry_for=retry_for)
    try:
        dialect = channels.negotiate([ws.subprotocol or ""], SUBPROTOCOLS)
        if dialect is None:
            raise ConsoleError(f"the server agreed to none of {', '.join(SUBPROTOCOLS)}")
        fd = sys.stdin.fileno()
        if not os.isatty(fd):
            return await _Session(ws, dialect, fd=fd, interactive=False).run()
        print(f"Connected to {target}. Escape with Ctrl+]", file=sys.stderr, flush=True)
        with terminal.raw_mode(fd):
            return await _Session(ws, dialect, fd=fd, interactive=True).run()
    finally:
        await ws.close()


async def _connect(
    config: ClientConfig, *, address: str, target: Target, retry_for: float
) -> ClientConnection:
    """Open the WebSocket; retry 409 and 503 answers with backoff for `retry_for` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + retry_for
    delay = FIRST_BACKOFF
    announced = False
    while True:
        try:
            return await _open(config, address)
        except InvalidStatus as exc:
            message = _status_message(exc.response)
            remaining = deadline - loop.time()
            if exc.response.status_code not in RETRY_CODES or remaining <= 0:
                raise ConsoleError(message) from None
            if not announced:
                print(f"{target}: {message}; waiting", file=sys.stderr, flush=True)
                announced = True
            # Backoff between attempts, not synchronisation: the server has no event to wait on.
            await asyncio.sleep(min(delay, remaining))
            delay = min(delay * 2, MAX_BACKOFF)
        except (OSError, TimeoutError, WebSocketException) as exc:
            raise ConsoleError(f"cannot connect to {config.server}: {exc}") from None


async def _open(config: ClientConfig, address: str) -> ClientConnection:
    tls: dict[str, Any] = {}
    if address.startswith("wss:"):
        tls["ssl"] = config.ssl
        if config.server_hostname:
            tls["server_hostname"] = config.server_hostname
    return await connect(
        address,
        subprotocols=[Subprotocol(p) for p in SUBPROTOCOLS],
        additional_headers=dict(config.headers),
        compression=None,
        max_size=MAX_MESSAGE,
        open_timeout=OPEN_TIMEOUT,
        close_timeout=CLOSE_TIMEOUT,
        **tls,
    )


def _status_message(response: Response) -> str:
    """The message of the `Status` an error answer carries, else its body or status line."""
    body = response.body or b""
    status = _json_object(body)
    if status is not None and status.get("message"):
        return str(status["message"])
    text = body.decode("utf-8", "replace").strip()
    return text or f"{response.status_code} {response.reason_phrase}"


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

    async def write(self, data: bytes) -> None:
        try:
            await asyncio.to_thread(self._write, data)
        except OSError as exc:
            raise ConsoleError(f"cannot write output: {exc}") from None

    def _write(self, data: bytes) -> None:
        self._stream.write(data)
        self._stream.flush()


class _Session:
    """One connected console: pumps both ways and decides the exit code."""

    def __init__(self, ws: ClientConnection, dialect: Dialect, *, fd: int, interactive: bool):
        self._ws = ws
        self._dialect = dialect
        self._fd = fd
        self._interactive = interactive
        self._stdin = _Stdin(fd)
        self._stdout = _Output(sys.stdout.buffer)
        self._stderr = _Output(sys.stderr.buffer)
        self._status = bytearray()

    async def run(self) -> int:
        """Pump until the server closes, or the user escapes or a signal stops us."""
        stopped = asyncio.Event()
        up = asyncio.create_task(self._up())
        down = asyncio.create_task(self._down())
        stop = asyncio.create_task(stopped.wait())
        tasks = {up, down, stop}
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
                    raise ConsoleError("stopped by a signal")
                down.result()
            return self._outcome()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks)

    async def _up(self) -> bool:
        """Copy stdin to the server; True when the user pressed the escape key."""
        try:
            while data := await self._stdin.read():
                if self._interactive and ESCAPE in data:
                    before = data[: data.index(ESCAPE)]
                    if before:
                        await self._send(channels.STDIN, before)
                    return True
                await self._send(channels.STDIN, data)
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
                raise ConsoleError(f"malformed message from the server: {exc}") from None
            if isinstance(event, ChannelData):
                await self._deliver(event)

    async def _deliver(self, event: ChannelData) -> None:
        if event.channel == channels.STDOUT:
            await self._stdout.write(event.data)
        elif event.channel == channels.STDERR:
            await self._stderr.write(event.data)
        elif event.channel == channels.ERROR:
            self._status += event.data
            status = _json_object(self._status)
            if status is not None and status.get("status") != "Success":
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
            raise ConsoleError(failure)
        code = self._ws.close_code
        if code == NORMAL_CLOSURE:
            return 0
        reason = self._ws.close_reason or "no reason given"
        if code is None or code == 1006:
            raise ConsoleError("lost the connection to the server")
        raise ConsoleError(f"the server closed the console ({code}): {reason}")

    def _failure(self) -> str | None:
        """The message of a non-Success `Status` on the error channel."""
        if not self._status:
            return None
        status = _json_object(self._status)
        if status is None:
            return self._status.decode("utf-8", "replace")
        if status.get("status") == "Success":
            return None
        return str(status.get("message") or status.get("reason") or "the session failed")


def _json_object(data: bytes | bytearray) -> dict[str, Any] | None:
    try:
        obj = json.loads(data)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None
