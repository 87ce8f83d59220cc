"""The throughput benchmark still runs end to end (a few MiB; timings are not checked)."""

from __future__ import annotations

from tests.bench.bench_throughput import PATHS
from tests.bench.procs import run_bench


def test_bench_throughput_prints_every_row() -> None:
    out = run_bench("tests.bench.bench_throughput", "--quick", "--mib", "2", timeout=240)
    assert "python -m tests.bench.bench_throughput --quick --mib 2" in out
    assert "### Throughput (2 MiB each way" in out
    rows = [
        r for r in out.splitlines() if r.startswith("| ") and "MB/s" not in r and "---" not in r
    ]
    for spec in PATHS:
        for tls in ("yes",) if spec.tls_modes == (True,) else ("no", "yes"):
            assert any(r.startswith(f"| {spec.label}") and f"| {tls} |" in r for r in rows), (
                spec.label,
                tls,
                out,
            )
    assert len(rows) == sum(len(spec.tls_modes) for spec in PATHS)
    # No path failed (a loaded machine may still cut the last ones for time).
    assert not [r for r in rows if "failed" in r], out
