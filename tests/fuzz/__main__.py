"""`python -m tests.fuzz TARGET [libFuzzer flags] [CORPUS_DIR...]`: run one fuzz target.

Targets are in `targets.py` (`python -m tests.fuzz --list`). Everything after
the target goes to libFuzzer, for example:

    python -m tests.fuzz spdy -runs=1000000
    nice -n 10 python -m tests.fuzz rfb -runs=1000000 -seed=1 /tmp/corpus-rfb

Defaults added unless given: `-timeout=10` (an input that runs longer is a
hang, reported and saved), `-rss_limit_mb=1024` and `-malloc_limit_mb=512`
(memory that grows is a finding too), `-max_len=4096`, and
`-artifact_prefix=.cache/fuzz/TARGET/` (git-ignored: findings never land in
the working directory, where they could be committed). libFuzzer prints a
line per new coverage or every few seconds, and `Done N runs in S second(s)`
at the end; a finding stops the run, prints its traceback and writes the
input to a `crash-…`/`timeout-…`/`oom-…` file there, and the exit code is
non-zero. Replay one with `python -m tests.fuzz TARGET FILE`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import atheris

DEFAULTS = {
    "-timeout": "10",
    "-rss_limit_mb": "1024",
    "-malloc_limit_mb": "512",
    "-max_len": "4096",
}


def main(argv: list[str]) -> int:
    """Run the target named in `argv[1]` with libFuzzer's flags that follow."""
    with atheris.instrument_imports(include=["subres"]):
        from tests.fuzz.targets import TARGETS
    if len(argv) < 2 or argv[1] in ("-h", "--help", "--list"):
        print(__doc__)
        print("targets:", " ".join(TARGETS))
        return 0 if len(argv) >= 2 else 2
    name, flags = argv[1], argv[2:]
    if name not in TARGETS:
        print(f"unknown target {name!r}; targets: {' '.join(TARGETS)}", file=sys.stderr)
        return 2
    given = {flag.split("=", 1)[0] for flag in flags}
    defaults = [f"{k}={v}" for k, v in DEFAULTS.items() if k not in given]
    if "-artifact_prefix" not in given:
        findings = Path(".cache", "fuzz", name)
        findings.mkdir(parents=True, exist_ok=True)
        defaults.append(f"-artifact_prefix={findings}/")
    atheris.Setup([f"{argv[0]} {name}", *defaults, *flags], TARGETS[name])
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
