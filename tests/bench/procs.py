"""Processes the benchmarks start, and what `/proc` says about them.

Every child is started here, remembered by PID and stopped by PID: its stdin
is closed first (the bench children exit on EOF), then SIGTERM, then SIGKILL,
each step bounded in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from subres.serving import loops
from tests import gotools
from tests.bench.client import raise_open_files_limit

__all__ = [
    "Child",
    "bench_header",
    "bench_main",
    "build_loadgen",
    "cpu_seconds",
    "memory_kib",
    "port_from_log",
    "run_bench",
    "run_loadgen",
    "serve_standalone",
    "spawn",
    "spawn_program",
    "tree_cpu_seconds",
    "wait_listening",
]

S = TypeVar("S")

ROOT = Path(__file__).resolve().parents[2]
"""The checkout: children run from here so `python -m tests.bench…` imports work."""
LOADGEN = Path(__file__).resolve().parent / "loadgen"
"""The Go client, source and sink of the benchmarks."""
STOP_TIMEOUT = 10.0
"""Seconds a child gets for each step of stopping."""


@dataclass
class Child:
    """A started process; its stdout is a pipe unless it was sent to a file."""

    name: str
    proc: asyncio.subprocess.Process
    stops_on_eof: bool = True
    """Whether closing stdin makes it exit (the bench's own children do; servers don't)."""

    @property
    def pid(self) -> int:
        """The process id."""
        return self.proc.pid

    async def expect(self, pattern: str) -> re.Match[str]:
        """The first stdout line matching `pattern` (callers bound the wait)."""
        assert self.proc.stdout is not None
        while line := (await self.proc.stdout.readline()).decode():
            if match := re.search(pattern, line):
                return match
        raise RuntimeError(f"{self.name} exited (code {await self.proc.wait()}) before {pattern!r}")

    def close_stdin(self) -> None:
        """Tell a bench child to finish: they all stop when stdin reaches EOF."""
        if self.proc.stdin is not None and not self.proc.stdin.is_closing():
            self.proc.stdin.close()

    async def stop(self) -> int:
        """Stop the process by its PID, politely first; its exit code."""
        self.close_stdin()
        first = [None] if self.stops_on_eof else []
        for sig in (*first, signal.SIGTERM, signal.SIGKILL):
            if sig is not None and self.proc.returncode is None:
                self.proc.send_signal(sig)
            try:
                async with asyncio.timeout(STOP_TIMEOUT):
                    return await self.proc.wait()
            except TimeoutError:
                continue
        raise RuntimeError(f"{self.name} (pid {self.pid}) did not exit after SIGKILL")


def run_bench(module: str, *args: str, timeout: float) -> str:
    """Run `python -m module args…` from the checkout to the end; its stdout (it must succeed)."""
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


async def spawn(
    name: str,
    module: str,
    *args: str,
    log: Path | None = None,
    stops_on_eof: bool = True,
    env: dict[str, str] | None = None,
) -> Child:
    """Start `python -m module args…` from the checkout; stderr to `log` when given.

    `env` adds to (not replaces) this process's environment.
    """
    return await spawn_program(
        name, [sys.executable, "-m", module, *args], log=log, stops_on_eof=stops_on_eof, env=env
    )


async def spawn_program(
    name: str,
    argv: Sequence[str],
    *,
    log: Path | None = None,
    stops_on_eof: bool = True,
    env: dict[str, str] | None = None,
) -> Child:
    """Start any program from the checkout, stdin and stdout piped; stderr to `log` when given."""
    stderr = log.open("ab") if log is not None else None
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=ROOT,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
            env={**os.environ, **(env or {})},
        )
    finally:
        if stderr is not None:
            stderr.close()
    return Child(name, proc, stops_on_eof)


def memory_kib(pid: int) -> dict[str, int]:
    """Rss, Pss and Anonymous of `pid` in KiB, from smaps_rollup (VmRSS if absent)."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        status = Path(f"/proc/{pid}/status").read_text()
        rss = int(re.search(r"VmRSS:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
        return {"Rss": rss, "Pss": rss, "Anonymous": rss}
    fields = dict(re.findall(r"^(\w+):\s+(\d+) kB", text, re.MULTILINE))
    return {k: int(fields[k]) for k in ("Rss", "Pss", "Anonymous")}


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds `pid` has used so far."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    # The command name may hold spaces and parentheses: fields start after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of `pid`, its reaped children and its live (or zombie) descendants.

    Relays that fork per connection (socat, websockify) spend their time in
    children: a child that ended and was waited for is in the parent's
    cutime and cstime (10 ms ticks), one still there is read directly. A
    live process's own time is its threads' scheduler time in nanoseconds
    (`/proc/PID/task/*/schedstat`), so short transfers still measure.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2 :].split()
    own = _scheduled_seconds(pid)
    if own is None:
        own = sum(int(f) for f in fields[11:13]) / os.sysconf("SC_CLK_TCK")
    total = own + sum(int(f) for f in fields[13:15]) / os.sysconf("SC_CLK_TCK")
    for child in live_children(pid):
        total += tree_cpu_seconds(child)
    return total


def _scheduled_seconds(pid: int) -> float | None:
    """The CPU time of `pid`'s live threads, in seconds; None when /proc does not say."""
    total = 0
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            total += int((task / "schedstat").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return total / 1e9


def live_children(pid: int) -> list[int]:
    """Children of `pid` not yet waited for, from every thread's children list."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                found += [int(c) for c in (task / "children").read_text().split()]
    return found


def build_loadgen() -> Path:
    """Build `loadgen` once per source version into the Go tools' cache."""
    flags = "-s -w"
    target = gotools.cache_dir() / "bin" / f"loadgen-{gotools.source_key(LOADGEN, flags)}"
    if target.is_file() and os.access(target, os.X_OK):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    env = {**os.environ, "GOFLAGS": f"{os.environ.get('GOFLAGS', '')} -mod=mod".strip()}
    try:
        subprocess.run(
            ["go", "build", "-trimpath", "-buildvcs=false", "-ldflags", flags, "-o", partial, "."],
            cwd=LOADGEN,
            env=env,
            check=True,
            capture_output=True,
            timeout=gotools.BUILD_TIMEOUT_S,
        )
        partial.replace(target)
    finally:
        partial.unlink(missing_ok=True)
    return target


async def run_loadgen(argv: Sequence[str], *, limit: float) -> dict[str, Any]:
    """Run `loadgen` (`argv` with its path first) to its end within `limit` seconds,
    killed past it; the JSON it prints, or RuntimeError with the end of its stderr."""
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        async with asyncio.timeout(limit):
            out, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    if proc.returncode != 0:
        reason = err.decode(errors="replace").strip()[-500:]
        raise RuntimeError(f"loadgen {argv[1]} failed: {reason}")
    result: dict[str, Any] = json.loads(out)
    return result


SERVER_START_TIMEOUT = 60.0
"""Seconds a `subres serve` may take to listen (thousands of machines to load)."""


async def port_from_log(child: Child, log: Path) -> int:
    """The port a starting server says it serves on, from its log (bounded wait)."""
    async with asyncio.timeout(SERVER_START_TIMEOUT):
        while child.proc.returncode is None:
            text = await asyncio.to_thread(log.read_text)
            if found := re.search(r"serving on https?://[^:]+:(\d+)", text):
                return int(found.group(1))
            await asyncio.sleep(0.1)
    text = await asyncio.to_thread(log.read_text)
    raise RuntimeError(f"{child.name} exited early:\n{text[-2000:]}")


async def serve_standalone(root: Path, *flags: str) -> tuple[Child, int]:
    """`subres serve --standalone` on 127.0.0.1 with `root`'s machines.yaml, tokens.csv
    and certs (and `flags`); the child, once it listens, and its port."""
    log = root / "server.log"
    child = await spawn(
        "server",
        "subres",
        "serve",
        *("--standalone", str(root / "machines.yaml")),
        *("--token-auth-file", str(root / "tokens.csv")),
        *("--secure-port", "0", "--cert-dir", str(root / "certs")),
        *("--bind-address", "127.0.0.1", *flags),
        log=log,
        stops_on_eof=False,
    )
    try:
        return child, await port_from_log(child, log)
    except BaseException:
        await child.stop()
        raise


async def wait_listening(child: Child, port: int) -> None:
    """Wait until `port` accepts connections (the probe connection is closed at once)."""
    async with asyncio.timeout(SERVER_START_TIMEOUT):
        while True:
            if child.proc.returncode is not None:
                raise RuntimeError(f"{child.name} exited with {child.proc.returncode}")
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                await asyncio.sleep(0.1)
                continue
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            return


def bench_main(
    run: Callable[[S, Sequence[str]], Coroutine[Any, Any, None]],
    parse: Callable[[Sequence[str]], S],
    argv: Sequence[str] | None,
) -> None:
    """A bench's entry point: parse the command line (`sys.argv` by default), lift the
    descriptor limit (thousands of sockets), run."""
    args = list(sys.argv[1:] if argv is None else argv)
    raise_open_files_limit()
    asyncio.run(run(parse(args), args))


def bench_header(title: str, module: str, argv: Sequence[str], *facts: str) -> str:
    """A bench's opening: its title, the command that reruns it, the machine, `facts`."""
    command = " ".join([f"python -m {module}", *map(shlex.quote, argv)])
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    lines = [
        f"## {title}",
        "",
        f"- rerun: `cd {ROOT} && {command}`",
        f"- machine: nproc {os.cpu_count()}, load average {load} at start, "
        f"{platform.platform()}, Python {platform.python_version()}",
        # Every subres process a bench starts reads it (`subres.serving.loops`).
        f"- subres's event loop: {os.environ.get(loops.ENV) or loops.DEFAULT} "
        f"(set ${loops.ENV} to choose)",
    ]
    return "\n".join(lines + [f"- {fact}" for fact in facts])
