"""The live-streams benchmark still runs end to end (a few sessions; timings are not checked)."""

from __future__ import annotations

from tests.bench.procs import run_bench


def test_bench_streams_prints_its_table_and_refuses_nothing() -> None:
    out = run_bench("tests.bench.bench_streams", "--smoke", timeout=900)
    assert "python -m tests.bench.bench_streams --smoke" in out
    [row] = [r for r in out.splitlines() if r.startswith("| with FlowSchema | 50 |")]
    cells = [c.strip() for c in row.strip("| ").split(" | ")]
    assert cells[2].startswith("50 ("), row  # every session opened and still open
    assert cells[5] == "0", row  # none refused
    assert "failed" not in cells[-1], row  # every list GET answered while they were open
    # The old behaviour's row is there (20 sessions are too few to be refused).
    assert any(r.startswith("| without FlowSchema | 20 |") for r in out.splitlines()), out
