"""Startup benchmark: how long the CLI takes before it is useful.

Run from the checkout: `python -m tests.bench.bench_startup [--quick]`.
It prints one markdown table, after the machine facts and the command to
rerun it:

- `subres --help`, `subres console --help`, `subres port-forward --help`:
  wall time of the installed `subres` entry point until it exits;
- first console byte: wall time from starting `subres console demo` (stdin a
  pipe, as in a script) until the first byte of the demo shell's output
  reaches its stdout, against a running `subres demo` (with `/bin/sh` as the
  machine's shell, so the shell's own start-up is small);
- for scale, `python -c pass` (the interpreter alone) and `kubectl --help`
  when the Go tools' cache holds a kubectl.

Each figure is the median (and minimum) of `--runs` runs after one warm-up,
with the CPU time (user + system) the measured processes used, a figure a
busy machine disturbs less than wall time.
Goals (issue 12): `console --help` ≤ 150 ms, first console byte ≤ 300 ms.
Everything runs on 127.0.0.1; the demo is stopped by PID at the end.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import resource
import selectors
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from tests.gotools import cache_dir

__all__ = ["main"]

ROOT = Path(__file__).resolve().parents[2]
SUBRES = Path(sys.executable).with_name("subres")
RUN_TIMEOUT = 30.0
DEMO_START_TIMEOUT = 60.0
GOALS_MS = {"subres console --help": 150.0, "first console byte": 300.0}


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The bench's flags."""
    p = argparse.ArgumentParser(prog="python -m tests.bench.bench_startup", description=__doc__)
    p.add_argument("--runs", type=int, default=15, help="measured runs per row")
    p.add_argument("--quick", action="store_true", help="3 runs per row")
    ns = p.parse_args(argv)
    if ns.quick:
        ns.runs = 3
    return ns


Timing = tuple[float, float]
"""Wall seconds, and CPU seconds of the process measured."""


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_exit(argv: Sequence[str]) -> Timing:
    """Until `argv` exits (output discarded; it must succeed)."""
    cpu = _children_cpu()
    started = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, timeout=RUN_TIMEOUT, check=True)
    return time.perf_counter() - started, _children_cpu() - cpu


def first_byte(argv: Sequence[str], env: dict[str, str]) -> Timing:
    """From starting `argv` until its stdout has a byte (CPU: the whole run, told to exit then)."""
    cpu = _children_cpu()
    started = time.perf_counter()
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(proc.stdout, selectors.EVENT_READ)
            if not selector.select(RUN_TIMEOUT):
                raise RuntimeError(f"no output from {shlex.join(argv)} in {RUN_TIMEOUT}s")
        elapsed = time.perf_counter() - started
        proc.stdin.write(b"exit\n")
        proc.stdin.close()
        proc.stdout.read()
        proc.wait(RUN_TIMEOUT)
        return elapsed, _children_cpu() - cpu
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(RUN_TIMEOUT)


def measure(run: Callable[[], Timing], runs: int) -> list[Timing]:
    """`runs` timings after one warm-up (which fills the page cache)."""
    run()
    return [run() for _ in range(runs)]


class Demo:
    """A `subres demo` on a free port, started for the run and stopped by PID."""

    def __init__(self, state: Path) -> None:
        self.env = {**os.environ, "SHELL": "/bin/sh", "HOME": str(state)}
        self.kubeconfig = state / "kubeconfig"
        self._proc = subprocess.Popen(
            [str(SUBRES), "demo", "--state-dir", str(state), "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=self.env,
        )

    def wait_ready(self) -> None:
        """Until the banner says it serves."""
        assert self._proc.stdout is not None
        deadline = time.monotonic() + DEMO_START_TIMEOUT
        seen = b""
        with selectors.DefaultSelector() as selector:
            selector.register(self._proc.stdout, selectors.EVENT_READ)
            while b"Try:" not in seen:
                left = deadline - time.monotonic()
                if left <= 0 or not selector.select(left):
                    raise RuntimeError(f"subres demo did not start: {seen.decode()}")
                chunk = os.read(self._proc.stdout.fileno(), 65536)
                if not chunk:
                    raise RuntimeError(f"subres demo exited: {seen.decode()}")
                seen += chunk

    def stop(self) -> None:
        """SIGTERM, then SIGKILL, each bounded."""
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(RUN_TIMEOUT)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(RUN_TIMEOUT)
        if self._proc.stdout is not None:
            self._proc.stdout.close()


def row(name: str, timings: list[Timing]) -> str:
    """One table row in milliseconds, with its goal when it has one."""
    wall = [w for w, _ in timings]
    median = statistics.median(wall) * 1000
    cpu = statistics.median(c for _, c in timings) * 1000
    goal = GOALS_MS.get(name)
    verdict = "" if goal is None else f"≤ {goal:.0f}: {'met' if median <= goal else 'NOT met'}"
    return (
        f"| {name} | {len(timings)} | {median:.0f} | {min(wall) * 1000:.0f} | {cpu:.0f} "
        f"| {verdict} |"
    )


def kubectl() -> Path | None:
    """A kubectl the Go tools' cache already holds (never built here)."""
    found = sorted((cache_dir() / "bin").glob("kubectl-*"))
    return found[-1] if found else None


def header(argv: Sequence[str]) -> str:
    """What was run, where, with what."""
    command = " ".join(["python -m tests.bench.bench_startup", *map(shlex.quote, argv)])
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    install = "editable" if _editable() else "regular"
    return "\n".join(
        [
            "## subres startup benchmark",
            "",
            f"- rerun: `cd {ROOT} && {command}`",
            f"- machine: nproc {os.cpu_count()}, load average {load} at start, "
            f"{platform.platform()}",
            f"- Python {platform.python_version()}; `{SUBRES}` ({install} install)",
            "- the cores are shared with other work: treat numbers as noisy",
        ]
    )


def _editable() -> bool:
    site = Path(sys.prefix, "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}")
    return any(site.glob("site-packages/__editable__*subres*"))


def run(ns: argparse.Namespace, argv: Sequence[str]) -> None:
    """Measure every row and print the table."""
    print(header(argv) + "\n", flush=True)
    rows = [
        ("python -c pass", [sys.executable, "-c", "pass"]),
        ("subres --help", [str(SUBRES), "--help"]),
        ("subres console --help", [str(SUBRES), "console", "--help"]),
        ("subres port-forward --help", [str(SUBRES), "port-forward", "--help"]),
    ]
    if (found := kubectl()) is not None:
        rows.append(("kubectl --help", [str(found), "--help"]))
    lines = [
        "| what | runs | median ms | min ms | CPU ms (median) | goal (median wall ms) |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for name, command in rows:
        lines.append(row(name, measure(functools.partial(timed_exit, command), ns.runs)))
    with tempfile.TemporaryDirectory(prefix="subres-bench-") as tmp:
        demo = Demo(Path(tmp))
        try:
            demo.wait_ready()
            console = [str(SUBRES), "--kubeconfig", str(demo.kubeconfig), "console", "demo"]
            timings = measure(lambda: first_byte(console, demo.env), ns.runs)
        finally:
            demo.stop()
    lines.append(row("first console byte", timings))
    print("### CLI startup\n\n" + "\n".join(lines) + "\n", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the bench; the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    run(parse(args), args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
