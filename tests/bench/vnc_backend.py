"""A VNC server of any size for the benchmarks, run as its own process.

`python -m tests.bench.vnc_backend --socket PATH --width W --height H` serves
the demo display (`subres.demo.vnc`) at that size on a unix socket, prints
`ready` on stdout, and runs until stdin closes or SIGTERM arrives. Its own
process keeps the framebuffer it builds out of the server's memory figures.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path

from subres.demo.vnc import Display, VncServer
from tests.bench.echo_backend import stop_on_stdin_eof

__all__ = ["main"]


async def serve(socket: Path, width: int, height: int) -> None:
    """Serve until stdin reaches EOF or a signal asks us to stop."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = VncServer(socket, display=Display(width=width, height=height, clock=lambda: "0"))
    await server.start()
    print("ready", flush=True)
    stop_on_stdin_eof(stop)
    try:
        await stop.wait()
    finally:
        await server.stop()


def main() -> None:
    """Entry point."""
    p = argparse.ArgumentParser(prog="python -m tests.bench.vnc_backend", description=__doc__)
    p.add_argument("--socket", type=Path, required=True)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--height", type=int, default=768)
    ns = p.parse_args()
    asyncio.run(serve(ns.socket, ns.width, ns.height))


if __name__ == "__main__":
    main()
