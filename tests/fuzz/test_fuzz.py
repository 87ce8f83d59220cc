"""A short slice of every fuzz target, as CI runs it: each must finish its runs with no finding.

The long runs (10^6 inputs per target) are `python -m tests.fuzz TARGET
-runs=1000000`; docs/development.md records their figures.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.bench.procs import ROOT
from tests.fuzz.targets import TARGETS

RUNS = 3000


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_target_survives_a_short_run(target: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.fuzz", target, f"-runs={RUNS}", "-seed=1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    # libFuzzer reports on stderr; a finding exits non-zero with its traceback there.
    assert done.returncode == 0, done.stderr[-4000:]
    assert f"Done {RUNS} runs" in done.stderr


def test_unknown_target_is_refused() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.fuzz", "nosuch"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2 and "unknown target 'nosuch'" in done.stderr
