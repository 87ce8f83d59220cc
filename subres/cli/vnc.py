"""`subres vnc`: a machine's display in a local VNC viewer, like `virtctl vnc`.

Owns the verb's flags, the local TCP listener (127.0.0.1 by default) whose
connections are relayed to the `vnc` subresource, `--proxy-only` (prints
`{"port": N}` and relays until interrupted), and finding and starting a
viewer. The machine comes first: before a viewer is looked for or anything
listens, a dry run (`api.dry_run`) makes a refusal (no such machine, machine
stopped, no display) an error at once, without taking the display from
whoever views it. Before a viewer starts, its first connection is opened,
which dials the display: a backend that refuses is an error (exit 1), not a
viewer that cannot connect. Each later local connection opens its own
WebSocket when it arrives, so a viewer never gets one that someone else took
over meanwhile; a refusal then, or a display that ends for a reason (taken
over, the machine's VNC server gone), is said on stderr, since a viewer
shows only that it was disconnected.
`--view-only` relays to `vnc-observe` instead: the viewer watches, its input
goes nowhere, and nobody is taken over. The relaying itself is the
port-forward verb's (`portforward.bridge`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import shutil
import signal
import sys

from subres.cli import api, kubeconfig, portforward, terminal
from subres.cli.api import CommandError, Target
from subres.cli.kubeconfig import ClientConfig

__all__ = ["VIEWERS", "main", "viewer_command"]

VIEWERS = (
    ("remote-viewer", "remote-viewer vnc://{address}:{port}"),
    ("vncviewer", "vncviewer {address}::{port}"),
)
"""Viewers tried in order when `--viewer` is not given: the program and how to run it."""
VIEWER_STOP_TIMEOUT = 5.0


def viewer_command(template: str | None) -> list[str]:
    """The viewer's argv template: `--viewer`'s, else the first known viewer installed."""
    if template is not None:
        if "{port}" not in template:
            raise CommandError("--viewer needs {port} (and usually {address}) in its command")
        return shlex.split(template)
    for program, command in VIEWERS:
        if shutil.which(program):
            return shlex.split(command)
    names = " or ".join(program for program, _ in VIEWERS)
    raise CommandError(f"no VNC viewer found: install {names}, or use --viewer or --proxy-only")


@api.command
def main(ns: argparse.Namespace) -> int:
    """Relay until interrupted (or until the viewer exits)."""
    typed = api.parse_target(ns.target)
    config = kubeconfig.from_args(ns)
    return asyncio.run(_vnc(config, typed, ns))


async def _vnc(config: ClientConfig, typed: api.TargetText, ns: argparse.Namespace) -> int:
    group_version = ns.api_group_version
    target = await api.resolve(
        typed, config, group_version=group_version, namespace_flag=ns.namespace
    )
    base = api.object_url(config, target, group_version=group_version)
    sub = "vnc-observe" if ns.view_only else "vnc"
    checked = api.object_url(config, target, group_version=group_version, websocket=False)
    await api.dry_run(config, f"{checked}/{sub}", target=target)
    viewer = None if ns.proxy_only else viewer_command(ns.viewer)
    return await _Relay(config, f"{base}/{sub}", target).run(ns.address, ns.port, viewer)


class _Relay:
    """The local listener and the WebSocket of each connection it accepts."""

    def __init__(self, config: ClientConfig, url: str, target: Target) -> None:
        self._config = config
        self._url = url
        self._target = target
        self._connections: set[asyncio.Task[None]] = set()
        self._stop = asyncio.Event()
        self._first: portforward.WebSocketLink | None = None
        """The viewer's first connection, opened before the viewer starts."""

    async def run(self, address: str, port: int, viewer: list[str] | None) -> int:
        try:
            server = await asyncio.start_server(self._serve, address, port)
        except OSError as exc:
            raise CommandError(f"cannot listen on {address}:{port}: {api.os_reason(exc)}") from None
        bound = int(server.sockets[0].getsockname()[1])
        try:
            with terminal.on_signals((signal.SIGINT, signal.SIGTERM), self._stop.set):
                if viewer is None:
                    print(json.dumps({"port": bound}), flush=True)
                    await self._stop.wait()
                    return 0
                self._first = await portforward.open_link(
                    self._config, self._url, target=self._target
                )
                return await self._view(viewer, address=address, port=bound)
        finally:
            server.close()
            await self._end_connections()
            if self._first is not None:  # the viewer never connected
                await self._first.close()

    async def _view(self, viewer: list[str], *, address: str, port: int) -> int:
        argv = [arg.format(address=address, port=port) for arg in viewer]
        try:
            proc = await asyncio.create_subprocess_exec(*argv)
        except OSError as exc:
            raise CommandError(f"cannot start {argv[0]}: {exc.strerror or exc}") from None
        waiter = asyncio.create_task(proc.wait())
        stopped = asyncio.create_task(self._stop.wait())
        await asyncio.wait([waiter, stopped], return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if proc.returncode is None:
            proc.terminate()
            try:
                async with asyncio.timeout(VIEWER_STOP_TIMEOUT):
                    await waiter
            except TimeoutError:
                proc.kill()
                await waiter
        return 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            link, self._first = self._first, None
            if link is None:
                link = await portforward.open_link(self._config, self._url, target=self._target)
            await portforward.bridge(reader, writer, link)
            if why := link.ended_by_server():
                print(f"{self._target}: the display session ended: {why}", file=sys.stderr)
        except CommandError as exc:
            print(exc.line(), file=sys.stderr, flush=True)
        except asyncio.CancelledError:
            # Only we cancel these, on exit; asyncio would log a cancelled
            # connection handler as an unhandled error.
            pass
        finally:
            writer.close()
            self._connections.discard(task)

    async def _end_connections(self) -> None:
        for task in self._connections:
            task.cancel()
        if self._connections:
            await asyncio.wait(self._connections)
