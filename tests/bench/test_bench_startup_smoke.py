"""The startup benchmark still runs end to end (one run per row; timings are not checked)."""

from __future__ import annotations

from tests.bench.procs import run_bench


def test_bench_startup_prints_its_table() -> None:
    out = run_bench("tests.bench.bench_startup", "--runs", "1", timeout=180)
    assert "python -m tests.bench.bench_startup --runs 1" in out
    for name in ("subres console --help", "first console byte"):
        assert f"| {name} | 1 | " in out
