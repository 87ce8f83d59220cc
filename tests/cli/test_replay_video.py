"""`subres replay --video`: a display recording exported by the real ffmpeg, or said why not.

The recording is written with the format's own writer: a red screen, then
a blue rectangle over its left half two seconds later, then a long pause.
ffmpeg decodes the exported file back to raw pictures, which must show
those colours at those moments (within what a lossy codec changes).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from subres.protocol import displayrec
from tests.cli.conftest import CLI_TIMEOUT, cli, cli_env

WIDTH, HEIGHT = 64, 48
RED, BLUE = b"\xff\x00\x00", b"\x00\x00\xff"


def recording(path: Path) -> Path:
    writer = displayrec.Writer()
    blocks = []
    writer.frame(0, WIDTH, HEIGHT, RED * WIDTH * HEIGHT)
    blocks.append(writer.take())
    writer.mark(100, "alice (viewer) attached")
    writer.rect(2000, (0, 0, WIDTH // 2, HEIGHT), BLUE * (WIDTH // 2) * HEIGHT)
    writer.end(60_000)  # a minute of nothing: shortened to --idle-time-limit
    blocks.append(writer.take())
    data = displayrec.Header(1714557723, "Machine default/vm1 vnc").encode()
    data += b"".join(displayrec.seal(*block) for block in blocks if block is not None)
    path.write_bytes(data)
    return path


def replay(
    *args: str | Path, home: Path, path: str | None = None
) -> subprocess.CompletedProcess[bytes]:
    env = cli_env(home)
    if path is not None:
        env["PATH"] = path
    return subprocess.run(
        cli("replay", *args), capture_output=True, env=env, timeout=CLI_TIMEOUT, check=False
    )


def frames(video: Path) -> list[bytes]:
    """The video's pictures as raw RGB, decoded by ffmpeg."""
    done = subprocess.run(
        [
            "ffmpeg",
            "-loglevel",
            "error",
            "-i",
            str(video),
            "-f",
            "rawvideo",
            "-pix_fmt",
            "rgb24",
            "-",
        ],
        capture_output=True,
        timeout=CLI_TIMEOUT,
        check=True,
    )
    size = WIDTH * HEIGHT * 3
    return [done.stdout[i : i + size] for i in range(0, len(done.stdout), size)]


def colour(picture: bytes, x: int, y: int) -> tuple[int, ...]:
    start = (y * WIDTH + x) * 3
    return tuple(picture[start : start + 3])


def near(found: tuple[int, ...], wanted: bytes) -> bool:
    return all(abs(a - b) < 48 for a, b in zip(found, wanted, strict=True))


def test_a_display_recording_exports_to_a_video_that_shows_it(tmp_path: Path) -> None:
    assert shutil.which("ffmpeg"), "ffmpeg is missing: scripts/test installs it"
    source = recording(tmp_path / "vm1.display")
    video = tmp_path / "vm1.mp4"
    done = replay(source, "--video", video, "--fps", "2", "--idle-time-limit", "1", home=tmp_path)
    assert done.returncode == 0, done.stderr
    pictures = frames(video)
    # Two seconds of red, then blue on the left; the long pause is cut to a second.
    assert 5 <= len(pictures) <= 7, len(pictures)
    assert near(colour(pictures[0], 50, 20), RED) and near(colour(pictures[0], 10, 20), RED)
    assert near(colour(pictures[-1], 10, 20), BLUE) and near(colour(pictures[-1], 50, 20), RED)
    assert done.stderr.decode().startswith(f"Exported {len(pictures) / 2:.1f}s")


def test_without_ffmpeg_the_export_says_how_to_get_it(tmp_path: Path) -> None:
    source = recording(tmp_path / "vm1.display")
    empty = tmp_path / "bin"
    empty.mkdir()
    done = replay(source, "--video", tmp_path / "vm1.mp4", home=tmp_path, path=str(empty))
    assert done.returncode == 1
    assert done.stderr.decode() == (
        "error: exporting video needs ffmpeg, which is not installed (Debian and Ubuntu: "
        "apt install ffmpeg); the browser page (subres web) plays display recordings without it\n"
    )
    assert not (tmp_path / "vm1.mp4").exists()


def test_a_display_recording_does_not_play_in_a_terminal_and_a_console_one_has_no_video(
    tmp_path: Path,
) -> None:
    source = recording(tmp_path / "vm1.display")
    done = replay(source, home=tmp_path)
    assert done.returncode == 1
    assert b"is a display recording: export it with --video OUT.mp4" in done.stderr
    cast = tmp_path / "vm1.cast"
    cast.write_text('{"version": 2, "width": 80, "height": 24}\n[0.5, "o", "hi"]\n')
    done = replay(cast, "--video", tmp_path / "x.mp4", home=tmp_path)
    assert done.returncode == 1
    assert b"is a console recording (asciicast): play it without --video" in done.stderr
    assert os.listdir(tmp_path).count("x.mp4") == 0
