"""The replicas benchmark still runs end to end (a few sessions; figures are not checked)."""

from __future__ import annotations

from tests.bench.procs import run_bench


def test_bench_replicas_prints_its_tables() -> None:
    out = run_bench("tests.bench.bench_replicas", "--smoke", timeout=900)
    assert "python -m tests.bench.bench_replicas --smoke" in out
    [level] = [r for r in out.splitlines() if r.startswith("| membership + peer relay | 20 ")]
    cells = [c.strip() for c in level.strip("| ").split(" | ")]
    assert cells[1] == "20 (20)", level  # every session opened
    # Steady state: the membership Leases' renewals (3 replicas, every 2 s) and little else.
    assert float(cells[2]) < 5, level
    latencies = [r for r in out.splitlines() if r.startswith("| membership + peer relay | ")]
    assert {r.split(" | ")[1] for r in latencies[1:]} == {"same replica", "two replicas"}, out
