"""A client process that opens many idle console sessions and holds them.

`python -m tests.bench.console_clients --port P --ca F --token T --first I
--count N` opens consoles of machines `m{I}…m{I+N-1}` (a few at a time),
prints `opened N failed M`, then holds them, answering only the server's
pings, until its stdin closes; then it closes them all and prints `closed`.
`--machine M --sub console-observe --subprotocol v5.channel.k8s.io --drain`
holds N observers of one console instead, reading everything it prints.
It runs apart from both the server and the benchmark driver so that the
client side's memory never mixes with what is measured.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from tests.bench.client import RAW, Target, raise_open_files_limit

__all__ = ["main"]


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--ca", type=Path, required=True)
    p.add_argument("--token", required=True)
    p.add_argument("--scheme", choices=("wss", "ws"), default="wss")
    p.add_argument("--first", type=int, required=True)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per open and close")
    p.add_argument("--machine", help="open every session on this machine (not m{first}…)")
    p.add_argument("--sub", default="console", help="the subresource (console-observe…)")
    p.add_argument("--subprotocol", default=RAW)
    p.add_argument("--drain", action="store_true", help="read and drop what the server sends")
    return p.parse_args(argv)


async def open_all(ns: argparse.Namespace, target: Target) -> tuple[list[ClientConnection], str]:
    """Open the sessions, `concurrency` at a time; the ones open and the first error."""
    tls = target.ssl_context()
    names = iter(ns.machine or f"m{i}" for i in range(ns.first, ns.first + ns.count))
    opened: list[ClientConnection] = []
    errors: list[str] = []

    async def worker() -> None:
        for name in names:
            try:
                opened.append(
                    await target.connect(name, ns.subprotocol, tls, ns.timeout, sub=ns.sub)
                )
            except (OSError, TimeoutError, ValueError) as exc:
                errors.append(f"{name}: {exc!r}")
            except Exception as exc:  # websockets' handshake errors: count, keep going
                errors.append(f"{name}: {exc!r}")

    await asyncio.gather(*(worker() for _ in range(ns.concurrency)))
    return opened, (errors[0] if errors else "")


async def wait_for_stdin_eof() -> None:
    """Block until the driver closes our stdin (or dies)."""
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    fd = sys.stdin.fileno()

    def readable() -> None:
        if not os.read(fd, 4096):
            loop.remove_reader(fd)
            done.set()

    loop.add_reader(fd, readable)
    await done.wait()


async def drain(session: ClientConnection) -> None:
    """Read what the server sends, as an observer's terminal would, and drop it."""
    with contextlib.suppress(ConnectionClosed):
        async for _ in session:
            pass


async def run(ns: argparse.Namespace) -> None:
    """Open, report, hold, close."""
    target = Target(port=ns.port, ca=ns.ca, token=ns.token, scheme=ns.scheme)
    sessions, error = await open_all(ns, target)
    failed = ns.count - len(sessions)
    print(f"opened {len(sessions)} failed {failed}", flush=True)
    if error:
        print(f"first error: {error}", file=sys.stderr, flush=True)
    drains = [asyncio.create_task(drain(s)) for s in sessions] if ns.drain else []
    await wait_for_stdin_eof()
    for task in drains:
        task.cancel()
    closing = [asyncio.ensure_future(s.close()) for s in sessions]
    if closing:
        await asyncio.wait(closing, timeout=ns.timeout)
    print("closed", flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point."""
    raise_open_files_limit()
    asyncio.run(run(parse(argv)))


if __name__ == "__main__":
    main()
