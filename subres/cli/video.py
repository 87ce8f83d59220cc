"""`subres replay FILE --video OUT`: a display recording exported to a video file by ffmpeg.

The recording is replayed (`protocol.displayrec`) at `--fps` frames a
second, pauses longer than `--idle-time-limit` shortened to it, and each
frame is piped to ffmpeg as raw RGB; ffmpeg picks the container and codec
from OUT's extension (`.mp4`, `.webm`, `.mkv`…). The video has the size of
the recording's first frame: a later frame of another size is cropped or
padded with black into it. Without ffmpeg on the PATH the export says so
and how to get it; the browser page plays display recordings without it.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator

from subres.cli.api import CommandError
from subres.protocol import displayrec

__all__ = ["export"]

INSTALL = (
    "exporting video needs ffmpeg, which is not installed (Debian and Ubuntu: "
    "apt install ffmpeg); the browser page (subres web) plays display recordings without it"
)


def export(data: bytes, output: str, *, fps: float, idle_limit: float) -> int:
    """Write the display recording `data` to the video file `output`; the frames written."""
    ffmpeg = shutil.which("ffmpeg")
    if ffmpeg is None:
        raise CommandError(INSTALL)
    frames = _frames(data, fps=fps, idle_limit=idle_limit)
    first = next(frames, None)
    if first is None:
        raise CommandError("the recording holds no picture to export")
    width, height, picture = first
    command = [
        ffmpeg, "-hide_banner", "-loglevel", "error", "-y",
        "-f", "rawvideo", "-pix_fmt", "rgb24", "-s", f"{width}x{height}", "-r", f"{fps:g}",
        "-i", "-",
        # Most codecs want even sizes and 4:2:0.
        "-vf", "pad=ceil(iw/2)*2:ceil(ih/2)*2", "-pix_fmt", "yuv420p",
        output,
    ]  # fmt: skip
    with subprocess.Popen(command, stdin=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdin is not None and proc.stderr is not None
        written = 0
        try:
            proc.stdin.write(picture)
            written = 1
            for w, h, rgb in frames:
                proc.stdin.write(_fit(rgb, (w, h), (width, height)))
                written += 1
            proc.stdin.close()
        except BrokenPipeError:
            pass  # ffmpeg gave up; its own words follow
        errors = proc.stderr.read().decode(errors="replace").strip()
    if proc.returncode != 0:
        raise CommandError(f"ffmpeg could not write {output}: {errors or proc.returncode}")
    return written


def _frames(data: bytes, *, fps: float, idle_limit: float) -> Iterator[tuple[int, int, bytes]]:
    """The screen every 1/fps seconds of the recording, pauses longer than `idle_limit`
    shortened to it."""
    _, offset = displayrec.read_header(data)
    screen = displayrec.Screen()
    step, limit = 1000 / fps, idle_limit * 1000
    clock: float | None = None  # the recording's time (ms) of the next frame
    for ref in displayrec.blocks(data, offset):
        for record in displayrec.records(data[ref.offset : ref.offset + ref.length]):
            clock = record.time if clock is None else clock
            while screen.width and clock < record.time:
                clock = max(clock, record.time - limit)
                yield screen.width, screen.height, bytes(screen.rgb)
                clock += step
            screen.apply(record)
    if screen.width:
        yield screen.width, screen.height, bytes(screen.rgb)


def _fit(rgb: bytes, size: tuple[int, int], into: tuple[int, int]) -> bytes:
    """A picture of `size` cropped or padded with black to `into`."""
    if size == into:
        return rgb
    (width, height), (out_w, out_h) = size, into
    row = min(width, out_w) * 3
    lines = (
        rgb[y * width * 3 : y * width * 3 + row].ljust(out_w * 3, b"\0")
        for y in range(min(height, out_h))
    )
    return b"".join(lines).ljust(out_w * out_h * 3, b"\0")
