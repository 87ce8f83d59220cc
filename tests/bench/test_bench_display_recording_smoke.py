"""The display recording benchmark still runs end to end, on both displays (figures unchecked)."""

from __future__ import annotations

from tests.bench.procs import run_bench


def test_bench_display_recording_prints_its_table() -> None:
    out = run_bench("tests.bench.bench_display_recording", "--seconds", "2", timeout=600)
    assert "python -m tests.bench.bench_display_recording --seconds 2" in out
    assert "### What recording a display costs" in out
    assert "\n| clock | " in out and "\n| qemu | " in out
