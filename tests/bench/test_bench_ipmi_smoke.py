"""The IPMI benchmark still runs end to end against ipmi_sim (tiny counts; timings not checked)."""

from __future__ import annotations

from tests.bench.procs import run_bench
from tests.ipmi_support import needs_ipmi_sim


@needs_ipmi_sim
def test_bench_ipmi_prints_its_table() -> None:
    out = run_bench("tests.bench.bench_ipmi", "--roundtrips", "20", timeout=180)
    assert "### One keystroke's echo through the BMC (ms)" in out
    assert "| `ipmitool -I lanplus -C 3 sol activate`, piped | 20 |" in out
    assert "| subres `ipmi://` console, WebSocket+TLS raw | 20 |" in out
