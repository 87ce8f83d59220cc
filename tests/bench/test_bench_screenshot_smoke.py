"""The screenshot benchmark still runs end to end (a small display; figures are not checked)."""

from __future__ import annotations

from tests.bench.procs import run_bench


def test_bench_screenshot_prints_its_table() -> None:
    out = run_bench("tests.bench.bench_screenshot", "--quick", timeout=180)
    assert "python -m tests.bench.bench_screenshot --quick" in out
    assert "### Server memory during concurrent screenshots (MiB)" in out
    assert "\n| 1 | " in out and "\n| 2 | " in out
