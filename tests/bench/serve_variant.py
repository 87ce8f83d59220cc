"""The subres application under a bench-only launcher, for finding where memory goes.

`python -m tests.bench.serve_variant [--plain] [--ssl-buffer N]
[--tracemalloc PATH] SERVE-FLAGS…` builds exactly what `subres serve` builds
(`subres.server.run.complete`) and serves it:

- with `--plain`, over plain TCP instead of TLS, so a run with and without it
  separates TLS's share of a session's memory from the rest;
- with `--ssl-buffer N`, after shrinking asyncio's per-connection TLS read
  buffer (`asyncio.sslproto.SSLProtocol.max_size`, 256 KiB in CPython 3.11)
  to N bytes, to see what that buffer costs;
- with `--shared-ssl-buffer`, after making every TLS connection read into
  one buffer per process instead of its own (safe in asyncio 3.11: the loop
  fills it and `buffer_updated` copies it out in the same callback), to see
  what per-session TLS memory remains without that buffer;
- with `--tracemalloc PATH`, tracing Python allocations and writing a
  snapshot to `PATH.<n>` on each SIGUSR1, so the driver can diff them;
- with `--cprofile PATH`, under cProfile, its stats dumped to `PATH` when
  the server stops (`python -m pstats PATH` reads them).

These switches exist only here: the server itself has no debug hooks.
"""

from __future__ import annotations

import argparse
import asyncio
import asyncio.sslproto
import cProfile
import logging
import signal
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

from subres.server import app as application
from subres.server import options as serve_options
from subres.server.run import Server, complete
from subres.serving import loops
from subres.serving.connections import raise_open_files_limit

__all__ = ["main"]

log = logging.getLogger("subres.bench.serve_variant")

TRACE_FRAMES = 8
"""Frames kept per traced allocation: enough to see which of our calls allocated."""


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """`subres serve`'s flags plus the variant switches."""
    p = argparse.ArgumentParser(description=__doc__)
    serve_options.add_arguments(p)
    p.add_argument("--plain", action="store_true", help="serve without TLS")
    p.add_argument("--ssl-buffer", type=int, help="asyncio TLS read buffer size in bytes")
    p.add_argument(
        "--shared-ssl-buffer", action="store_true", help="one TLS read buffer per process"
    )
    p.add_argument("--tracemalloc", type=Path, help="snapshot path prefix, written on SIGUSR1")
    p.add_argument("--cprofile", type=Path, help="profile with cProfile, stats to this path")
    return p.parse_args(argv)


async def start_plain(server: Server) -> web.AppRunner:
    """The same application on a plain TCP listener."""
    runner = web.AppRunner(application.build(server.state), handle_signals=False)
    await runner.setup()
    site = web.TCPSite(
        runner, server.options.bind_address, server.options.secure_port, backlog=1024
    )
    await site.start()
    log.info("serving on http://%s:%d", server.options.bind_address, runner.addresses[0][1])
    return runner


def share_ssl_buffer() -> None:
    """Replace each SSLProtocol's own read buffer with one shared buffer after __init__."""
    cls = asyncio.sslproto.SSLProtocol
    shared = bytearray(cls.max_size)
    view = memoryview(shared)
    original = cls.__init__

    def init(self: asyncio.sslproto.SSLProtocol, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        # The private buffer allocated just now is freed here; glibc reuses it next time.
        self._ssl_buffer = shared  # type: ignore[attr-defined]
        self._ssl_buffer_view = view  # type: ignore[attr-defined]

    cls.__init__ = init  # type: ignore[method-assign]


def snapshot_writer(prefix: Path) -> Callable[[], None]:
    """A SIGUSR1 handler that dumps numbered tracemalloc snapshots."""
    count = 0

    def write() -> None:
        nonlocal count
        path = prefix.with_name(f"{prefix.name}.{count}")
        tracemalloc.take_snapshot().dump(str(path))
        count += 1
        log.info("tracemalloc snapshot %s", path)

    return write


async def serve(ns: argparse.Namespace) -> None:
    """Run until SIGTERM or SIGINT."""
    server = complete(serve_options.Options.from_args(ns))
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runner = await start_plain(server) if ns.plain else None
    if runner is None:
        await server.start()
    if ns.tracemalloc is not None:
        # Traced from here on: the snapshots' difference is all that is read, and tracing
        # the load of thousands of machines would hold the start past the bench's timeout.
        tracemalloc.start(TRACE_FRAMES)
        loop.add_signal_handler(signal.SIGUSR1, snapshot_writer(ns.tracemalloc))
    try:
        await stop.wait()
    finally:
        if runner is not None:
            await server.state.sessions.close_all("the server is shutting down")
            await runner.cleanup()
        else:
            await server.stop()


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point."""
    ns = parse(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    raise_open_files_limit()
    if ns.ssl_buffer is not None:
        # Class attribute read by every SSLProtocol.__init__: the one knob there is.
        asyncio.sslproto.SSLProtocol.max_size = ns.ssl_buffer
    if ns.shared_ssl_buffer:
        share_ssl_buffer()
    if ns.cprofile is None:
        loops.run(serve(ns), loop=ns.loop)
        return
    # CPU time, not wall time: the machine is shared, and waiting is not cost.
    profiler = cProfile.Profile(time.process_time)
    try:
        profiler.runcall(loops.run, serve(ns), loop=ns.loop)
    finally:
        profiler.dump_stats(ns.cprofile)


if __name__ == "__main__":
    main()
