"""The audit sink benchmark still runs end to end (a few events; figures are not checked)."""

from __future__ import annotations

from tests.bench.procs import run_bench


def test_bench_audit_prints_its_table() -> None:
    out = run_bench("tests.bench.bench_audit", "--events", "200", timeout=180)
    assert "python -m tests.bench.bench_audit --events 200" in out
    for row in ("| up all along | 200 | ", "| down while spooled, then up | 200 | "):
        assert row in out
