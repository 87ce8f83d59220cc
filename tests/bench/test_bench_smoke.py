"""The console benchmark still runs end to end (tiny counts; timings are not checked)."""

from __future__ import annotations

import subprocess
import sys

from tests.bench.procs import ROOT

TABLE_TITLES = (
    "### Console echo round trip",
    "### Console sessions opened and closed per second",
    "### Server memory per idle console session",
)


def test_bench_console_prints_its_tables() -> None:
    args = ["--quick", "--sessions", "20", "--roundtrips", "50", "--idle", "50"]
    done = subprocess.run(
        [sys.executable, "-m", "tests.bench.bench_console", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "python -m tests.bench.bench_console --quick" in out
    for title in TABLE_TITLES:
        assert title in out
    assert "| subres, WebSocket+TLS, `v5.channel.k8s.io` |" in out
    # Every measured row is present: three paths, two concurrencies, one idle level.
    assert out.count("\n| ") >= 3 + 2 + 1 + 3
