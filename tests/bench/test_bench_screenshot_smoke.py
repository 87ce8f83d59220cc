"""The screenshot benchmark still runs end to end (a small display; figures are not checked)."""

from __future__ import annotations

import subprocess
import sys

from tests.bench.procs import ROOT


def test_bench_screenshot_prints_its_table() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.bench.bench_screenshot", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "python -m tests.bench.bench_screenshot --quick" in out
    assert "### Server memory during concurrent screenshots (MiB)" in out
    assert "\n| 1 | " in out and "\n| 2 | " in out
