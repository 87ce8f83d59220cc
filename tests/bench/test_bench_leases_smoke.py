"""The Lease benchmark still runs end to end (tiny counts, short Leases; no timings checked)."""

from __future__ import annotations

from tests.bench.procs import run_bench


def test_bench_leases_prints_its_tables() -> None:
    args = ["--duration", "3", "--renew", "1", "--takeovers", "3", "--window", "3"]
    out = run_bench("tests.bench.bench_leases", *args, "--expiries", "1", timeout=600)
    assert "python -m tests.bench.bench_leases --duration 3" in out
    for title in (
        "### Takeover: old session closed (4001)",
        "### Lease writes per live session",
        "### A dead replica's Lease blocks preserveSession",
    ):
        assert title in out
    assert "| other replica (through kube-apiserver to A, then at B) | 3 |" in out
    assert "| same replica (both through kube-apiserver to A) | 3 |" in out
