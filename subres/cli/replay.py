"""`subres replay FILE`: a recorded session played in the terminal, or a display's exported.

A console recording (asciicast v2): output events are written to stdout at
the pace they were recorded (times `--speed`, pauses longer than
`--idle-time-limit` shortened to it), markers (who attached, who left) are
said on stderr, resizes are skipped: the local terminal keeps its size. A
display recording cannot play in a terminal: `--video OUT` exports it with
ffmpeg (`cli.video`), and the browser page plays it. `-` reads the
recording from stdin, so `subres recordings vm1 NAME -o - | subres replay -`
plays one from the server.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import time
from collections.abc import Iterator
from typing import BinaryIO

from subres.cli import api, video
from subres.cli.api import CommandError
from subres.protocol import asciicast, displayrec

__all__ = ["main", "play"]


@api.command
def main(ns: argparse.Namespace) -> int:
    """Play the recording, or export a display's to video; 0 once done."""
    if ns.speed <= 0 or ns.fps <= 0:
        raise CommandError("--speed and --fps must be more than 0")
    try:
        with contextlib.ExitStack() as files:
            source = _open(ns.file, files)
            if source.peek(len(displayrec.MAGIC)).startswith(displayrec.MAGIC):
                _display(ns, source.read())
            elif ns.video is not None:
                raise CommandError(
                    f"{ns.file} is a console recording (asciicast): play it without --video, "
                    "which exports display recordings"
                )
            else:
                play(source, speed=ns.speed, idle_limit=ns.idle_time_limit)
    except OSError as exc:
        raise CommandError(f"cannot read {ns.file}: {api.os_reason(exc)}") from None
    except (asciicast.RecordingError, displayrec.DisplayRecordingError) as exc:
        raise CommandError(f"{ns.file} is not a recording subres can play: {exc}") from None
    except KeyboardInterrupt:
        return 130
    return 0


def _open(name: str, files: contextlib.ExitStack) -> io.BufferedReader:
    """The recording to read (stdin for `-`), buffered so that its start can be peeked at."""
    if name == "-":
        stdin = sys.stdin.buffer
        assert isinstance(stdin, io.BufferedReader)
        return stdin
    return files.enter_context(open(name, "rb"))


def _display(ns: argparse.Namespace, data: bytes) -> None:
    if ns.video is None:
        raise CommandError(
            f"{ns.file} is a display recording: export it with --video OUT.mp4, "
            "or play it on the browser page (subres web, its Recordings tab)"
        )
    frames = video.export(data, ns.video, fps=ns.fps, idle_limit=ns.idle_time_limit)
    print(f"Exported {frames / ns.fps:.1f}s ({frames} frames) to {ns.video}.", file=sys.stderr)


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
