"""A recording's lines wait in memory, bounded, and split into parts that each play alone."""

from __future__ import annotations

import json
from pathlib import Path

from subres.protocol import asciicast
from subres.protocol.channels import TerminalSize
from subres.sessions.recorder import Recorder


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def recorder(
    path: Path, *, max_file: int, max_pending: int = 1 << 20, size: TerminalSize | None = None
) -> Recorder:
    return Recorder(
        path,
        title="t",
        max_file=max_file,
        max_pending=max_pending,
        size=size,
        clock=Clock(),
        wall=lambda: 1700000000.0,
    )


def events(data: bytes) -> list[asciicast.Event]:
    _, items = asciicast.read(data.splitlines())
    return list(items)


def test_output_past_what_may_wait_is_dropped_and_said_so(tmp_path: Path) -> None:
    rec = recorder(tmp_path / "a.cast", max_file=1 << 20, max_pending=300)
    for _ in range(10):
        rec.output(b"x" * 40)
    ((path, data),) = rec.drain()
    seen = events(data)
    kept = sum(len(e.data) for e in seen if e.code == "o")
    lost = 10 * 40 - kept
    assert path == tmp_path / "a.cast" and 0 < kept < 400
    assert (seen[-1].code, seen[-1].data) == (
        "m",
        f"{lost} bytes of output lost: the disk was too slow",
    )
    rec.output(b"back")
    ((_, more),) = rec.drain()
    assert json.loads(more)[1:] == ["o", "back"]


def test_a_full_file_goes_on_in_a_part_with_its_own_header(tmp_path: Path) -> None:
    rec = recorder(tmp_path / "a.cast", max_file=150, size=TerminalSize(100, 30))
    rec.output(b"first part " * 10)
    rec.output(b"second part")
    rec.close()
    (first, one), (second, two) = rec.drain()
    assert (first.name, second.name) == ("a.cast", "a.2.cast")
    assert [e.data for e in events(one)] == ["first part " * 10]
    header, rest = asciicast.read(two.splitlines())
    assert (header.width, header.height, header.title) == (100, 30, "t (part 2)")
    (only,) = list(rest)
    # Its times count from its own start.
    assert (only.data, only.time) == ("second part", 1.0)
