"""The console benchmark still runs end to end (tiny counts; timings are not checked)."""

from __future__ import annotations

from tests.bench.procs import run_bench

TABLE_TITLES = (
    "### Console echo round trip",
    "### Console sessions opened and closed per second",
    "### Server memory per idle console session",
    "### Server memory over 2 bursts of 50 idle console sessions",
    "### The writer's round trip with observers on its console",
    "### 100 kept consoles",
)


def test_bench_console_prints_its_tables() -> None:
    args = ["--quick", "--sessions", "20", "--roundtrips", "50", "--idle", "50"]
    args += ["--cycles", "2", "--cycle-sessions", "50"]
    out = run_bench("tests.bench.bench_console", *args, timeout=180)
    assert "python -m tests.bench.bench_console --quick" in out
    for title in TABLE_TITLES:
        assert title in out
    assert "| subres, WebSocket+TLS, `v5.channel.k8s.io` |" in out
    assert "through the node agent (mTLS) |" in out
    assert "| SSH client straight to the SSH echo server |" in out
    assert "console on the SSH echo server (`ssh://`) |" in out
    # Every measured row is present: six paths, two concurrencies, one idle level, two
    # cycles, three observer levels, three kept-console states (and a header row per table).
    assert out.count("\n| ") >= 6 + 2 + 1 + 2 + 3 + 3 + 6


def test_bench_console_lists_python_allocations_per_session() -> None:
    # The harness variant traced from its start used to miss the bench's start timeout.
    args = ["--quick", "--phases", "memory", "--idle", "20", "--cycle-sessions", "20"]
    out = run_bench("tests.bench.bench_console", *args, "--tracemalloc", timeout=180)
    assert "#### tracemalloc: Python allocations grown at 20 sessions" in out
    assert "| `" in out.split("#### tracemalloc")[1]  # at least one allocation site
