"""The user-space cost of the server's WebSocket upload path, without sockets: for callgrind.

`python -m tests.bench.upload_cost --mib 64 PATH` pushes that many MiB of
masked 64 KiB binary frames, in 256 KiB reads, through one path and drops
what comes out; every run does the same work, so an instruction count is
repeatable on a loaded machine where CPU seconds are not:

    valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.out \\
        python -m tests.bench.upload_cost --mib 16 subres
    callgrind_annotate /tmp/cg.out | head -30

Paths: `subres` (`engine.wsserver.ServerWebSocket`: the read lands in the
shared buffer, frames are parsed in place and unmasked into the bytes handed
on, and the pump takes what one read brought as a list for one gathered
write) and `aiohttp` (aiohttp's C WebSocket reader, which subres used before:
each read arrives as a new bytes object, messages are queued, and the pump
joined the queued ones into one write). The "kernel" step is one copy of the
read in both: into the shared buffer, or into a new bytes object. `none`
only makes the reads: subtract its count (the frames are built in every run).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from subres.engine.wsserver import ServerWebSocket
from tests.wsframes import client_frame

__all__ = ["main"]

FRAME = 64 * 1024
READ = 256 * 1024


def wire(mib: int) -> list[bytes]:
    """`mib` MiB of masked 64 KiB frames, cut into 256 KiB reads."""
    frame = client_frame(2, os.urandom(FRAME))
    stream = frame * (mib * 1024 * 1024 // FRAME)
    return [stream[i : i + READ] for i in range(0, len(stream), READ)]


class _Transport:
    """Enough of a transport for a protocol that never pauses and never writes."""

    def get_protocol(self) -> Any:
        return None

    def set_protocol(self, protocol: Any) -> None:
        pass

    def is_closing(self) -> bool:
        return False


def subres_path(reads: list[bytes]) -> int:
    ws = ServerWebSocket(max_message=1 << 20, ping_interval=None, prefix=False, autoclose=True)
    ws.take(_Transport())  # type: ignore[arg-type]
    out = 0
    for chunk in reads:
        buffer = ws.get_buffer(-1)
        buffer[: len(chunk)] = chunk  # the kernel's copy, recv_into
        ws.buffer_updated(len(chunk))
        out += sum(map(len, ws.take_ready()))
    return out


def aiohttp_path(reads: list[bytes]) -> int:
    from aiohttp._websocket.reader import WebSocketDataQueue, WebSocketReader

    class Protocol:
        _reading_paused = False

        def pause_reading(self) -> None:
            pass

        def resume_reading(self) -> None:
            pass

    queue = WebSocketDataQueue(Protocol(), 1 << 30, loop=asyncio.new_event_loop())  # type: ignore[arg-type]
    reader = WebSocketReader(queue, 1 << 20, compress=False, decode_text=True)
    out = 0
    for chunk in reads:
        reader.feed_data(bytes(chunk))  # the kernel's copy, into a new bytes object
        messages = [bytes(message.data) for message, _ in queue._buffer]
        queue._buffer.clear()
        out += len(b"".join(messages))  # the pump's join of what was queued
    return out


def no_path(reads: list[bytes]) -> int:
    """Only the reads: what the other two counts include besides their own work."""
    return sum(map(len, reads))


PATHS: dict[str, Callable[[list[bytes]], int]] = {
    "subres": subres_path,
    "aiohttp": aiohttp_path,
    "none": no_path,
}


def main(argv: Sequence[str] | None = None) -> None:
    """Run one path and print the bytes it handed on and the CPU it took."""
    parser = argparse.ArgumentParser(prog="python -m tests.bench.upload_cost", description=__doc__)
    parser.add_argument("path", choices=sorted(PATHS))
    parser.add_argument("--mib", type=int, default=64)
    args = parser.parse_args(argv)
    reads = wire(args.mib)
    start = time.process_time()
    out = PATHS[args.path](reads)
    seconds = time.process_time() - start
    assert out == args.mib * 1024 * 1024, out
    print(f"{args.path}: {out} bytes, {seconds:.3f} s CPU, {seconds / out * 1e9:.2f} s/GB")


if __name__ == "__main__":
    main()
