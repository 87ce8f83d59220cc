"""The startup benchmark still runs end to end (one run per row; timings are not checked)."""

from __future__ import annotations

import subprocess
import sys

from tests.bench.procs import ROOT


def test_bench_startup_prints_its_table() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.bench.bench_startup", "--runs", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "python -m tests.bench.bench_startup --runs 1" in out
    for name in ("subres console --help", "first console byte"):
        assert f"| {name} | 1 | " in out
