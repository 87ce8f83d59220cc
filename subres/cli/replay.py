"""`subres replay FILE`: a recorded console session (asciicast v2) played in the terminal.

Output events are written to stdout at the pace they were recorded (times
`--speed`, pauses longer than `--idle-time-limit` shortened to it), markers
(who attached, who left) are said on stderr, resizes are skipped: the local
terminal keeps its size. `-` reads the recording from stdin, so
`subres recordings vm1 NAME -o - | subres replay -` plays one from the server.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from typing import BinaryIO

from subres.cli import api
from subres.cli.api import CommandError
from subres.protocol import asciicast

__all__ = ["main", "play"]


@api.command
def main(ns: argparse.Namespace) -> int:
    """Play the recording; 0 once it has played."""
    if ns.speed <= 0:
        raise CommandError("--speed must be more than 0")
    try:
        if ns.file == "-":
            play(sys.stdin.buffer, speed=ns.speed, idle_limit=ns.idle_time_limit)
        else:
            with open(ns.file, "rb") as file:
                play(file, speed=ns.speed, idle_limit=ns.idle_time_limit)
    except OSError as exc:
        raise CommandError(f"cannot read {ns.file}: {api.os_reason(exc)}") from None
    except asciicast.RecordingError as exc:
        raise CommandError(f"{ns.file} is not a recording subres can play: {exc}") from None
    except KeyboardInterrupt:
        return 130
    return 0


def play(source: BinaryIO, *, speed: float, idle_limit: float) -> None:
    """Write the recording in `source` to stdout at its pace."""
    header, events = asciicast.read(_lines(source))
    title = f"{header.title}, " if header.title else ""
    print(f"Replaying {title}{header.width}x{header.height}. Ctrl+C stops.", file=sys.stderr)
    out = sys.stdout.buffer
    played = 0.0  # recording time already shown, once long pauses are shortened
    last = 0.0
    started = time.monotonic()
    for event in events:
        played += min(event.time - last, idle_limit)
        last = event.time
        delay = started + played / speed - time.monotonic()
        if delay > 0:
            time.sleep(delay)  # the recording's own pace
        if event.code == "o":
            out.write(event.data.encode())
            out.flush()
        elif event.code == "m":
            print(f"\r\n[{event.data}]", file=sys.stderr, flush=True)


def _lines(source: BinaryIO) -> Iterator[bytes]:
    while line := source.readline(asciicast.MAX_LINE + 1):
        yield line
