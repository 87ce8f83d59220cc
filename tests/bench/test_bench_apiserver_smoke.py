"""The kube-apiserver benchmark still runs end to end (a few MiB; timings are not checked)."""

from __future__ import annotations

from tests.bench.procs import run_bench


def test_bench_apiserver_prints_a_row_per_transport_and_direction() -> None:
    out = run_bench("tests.bench.bench_apiserver", "--quick", timeout=600)
    assert "python -m tests.bench.bench_apiserver --quick" in out
    rows = [r for r in out.splitlines() if r.startswith("| SPDY")]
    assert [r.split(" | ")[:2] for r in rows] == [
        ["| SPDY/3.1", "up"],
        ["| SPDY/3.1", "down"],
        ["| SPDY in WebSocket", "up"],
        ["| SPDY in WebSocket", "down"],
    ], out
    # Every figure is a number: each transfer went through and each process was read.
    for row in rows:
        figures = [cell.strip() for cell in row.strip("| ").split(" | ")[2:]]
        assert all(float(f) >= 0 for f in figures), row
