"""A TCP echo server for the benchmarks, run as its own process.

`python -m tests.bench.echo_backend` listens on 127.0.0.1 (any free port),
prints `port N` on stdout, and echoes every connection until stdin closes or
SIGTERM arrives. It lives in its own process so that its CPU and memory stay
out of the server's and the client's accounts, and it uses a bare asyncio
protocol so that thousands of idle connections cost it little.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import cast

from tests.bench.client import raise_open_files_limit

__all__ = ["main"]


class Echo(asyncio.Protocol):
    """Writes back whatever arrives; closes when the peer does."""

    transport: asyncio.Transport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are only alike asyncio.Transport, not subclasses.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)

    def eof_received(self) -> bool | None:
        return False


async def serve() -> None:
    """Serve until stdin reaches EOF or a signal asks us to stop."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = await loop.create_server(Echo, "127.0.0.1", 0, backlog=4096)
    port = server.sockets[0].getsockname()[1]
    print(f"port {port}", flush=True)
    stop_on_stdin_eof(stop)
    await stop.wait()
    server.close()


def stop_on_stdin_eof(stop: asyncio.Event) -> None:
    """The parent holds our stdin pipe: when it closes it (or dies), we go too."""
    fd = sys.stdin.fileno()

    def readable() -> None:
        if not os.read(fd, 4096):
            asyncio.get_running_loop().remove_reader(fd)
            stop.set()

    asyncio.get_running_loop().add_reader(fd, readable)


def main() -> None:
    """Entry point."""
    raise_open_files_limit()
    asyncio.run(serve())


if __name__ == "__main__":
    main()
