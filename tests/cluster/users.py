"""People using the VM while the cluster changes under them, and what they saw, timed.

``Terminal`` runs a CLI verb (``subres console``, ``subres port-forward``) in a
pseudo-terminal, as a person does, and keeps everything it printed with the
time it arrived; ``Rerun`` runs it again when it exits, as a person would,
keeping how each run ended. ``ConsoleWriter`` types numbered probes into the VM's shell
(``echo probe-N-$((N*7))``: only the shell's answer contains the product) and
notes when each answer arrives; ``ForwardProber`` fetches the guest's web page
through a local port-forward. ``Timeline`` turns their records into what a
report needs: the longest time without an answer, and the CLI's own words.
Nothing here asserts: the tests decide what the figures must be.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import pty
import re
import signal
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

__all__ = [
    "ConsoleWriter",
    "ForwardProber",
    "Outage",
    "Rerun",
    "Terminal",
    "longest_outage",
    "terminal",
]

PROBE_EVERY_S = 0.5
PROBE_TIMEOUT_S = 5.0


@dataclass
class Terminal:
    """A CLI process on a pseudo-terminal and everything it printed, timestamped."""

    process: asyncio.subprocess.Process
    master: int
    chunks: list[tuple[float, bytes]] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def output(self) -> bytes:
        return b"".join(chunk for _, chunk in self.chunks)

    def text(self) -> str:
        return self.output.decode(errors="replace")

    def write(self, data: bytes) -> None:
        os.write(self.master, data)

    def lines_with(self, word: str) -> list[tuple[float, str]]:
        """(time it ended, line) of every output line containing `word`."""
        found, pending = [], b""
        for when, chunk in self.chunks:
            pending += chunk
            *lines, pending = pending.split(b"\n")
            found += [
                (when, line.decode(errors="replace").strip())
                for line in lines
                if word.encode() in line
            ]
        return found

    def time_at(self, offset: int) -> float:
        """When the output's byte at `offset` arrived."""
        seen = 0
        for when, chunk in self.chunks:
            seen += len(chunk)
            if seen > offset:
                return when
        return time.monotonic()

    async def wait_for(
        self, pattern: re.Pattern[bytes], *, after: int = 0, timeout_s: float
    ) -> float:
        """When `pattern` first appeared in the output past byte `after`; TimeoutError if not."""
        async with asyncio.timeout(timeout_s):
            while True:
                found = pattern.search(self.output, after)
                if found:
                    return self.time_at(found.end() - 1)
                if self.process.returncode is not None:
                    raise EOFError(
                        f"the CLI exited {self.process.returncode}: {self.text()[-2000:]}"
                    )
                self.arrived.clear()
                await self.arrived.wait()


@contextlib.asynccontextmanager
async def terminal(args: Sequence[str], *, env: dict[str, str]) -> AsyncIterator[Terminal]:
    """``python -m subres ARGS`` on a new pseudo-terminal; SIGTERM, then SIGKILL, at the end."""
    master, slave = pty.openpty()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "subres", *args,
        stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True,
    )  # fmt: skip
    os.close(slave)
    term = Terminal(process, master)
    loop = asyncio.get_running_loop()

    def readable() -> None:
        try:
            data = os.read(master, 65536)
        except OSError:  # the other side is gone (EIO)
            data = b""
        if not data:
            loop.remove_reader(master)
        else:
            term.chunks.append((time.monotonic(), data))
        term.arrived.set()

    loop.add_reader(master, readable)
    try:
        yield term
    finally:
        loop.remove_reader(master)
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(10):
                    await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()
        os.close(master)


@dataclass(frozen=True)
class Outage:
    """The longest time a user waited: from the last answer before it to the first after."""

    seconds: float
    start: float
    end: float


def longest_outage(answers: Sequence[float], *, since: float, until: float) -> Outage:
    """The longest gap between consecutive answer times within [since, until]."""
    times = [since, *sorted(t for t in answers if since <= t <= until), until]
    gaps = [Outage(b - a, a, b) for a, b in itertools.pairwise(times)]
    return max(gaps, key=lambda o: o.seconds)


@dataclass
class Rerun:
    """A CLI that a user runs again whenever it exits, and how each run ended.

    Runs live in `stack` (closed by the caller). `ready` is what a run prints
    once it is usable; a run that exits before that is recorded like any other.
    """

    args: Sequence[str]
    env: dict[str, str]
    stack: contextlib.AsyncExitStack
    ready: re.Pattern[bytes]
    runs: list[Terminal] = field(default_factory=list)
    exits: list[tuple[float, int, str]] = field(default_factory=list)
    """(when, exit code, its last line) of every run that ended."""

    async def current(self, *, timeout_s: float = 30.0) -> Terminal:
        """The running run, after starting a new one if the last has exited."""
        if self.runs and self.runs[-1].process.returncode is None:
            return self.runs[-1]
        if self.runs:
            ended = self.runs[-1]
            lines = [line for line in ended.text().splitlines() if line.strip()]
            code = ended.process.returncode
            assert code is not None
            self.exits.append((time.monotonic(), code, lines[-1].strip() if lines else ""))
        term = await self.stack.enter_async_context(terminal(self.args, env=self.env))
        self.runs.append(term)
        with contextlib.suppress(EOFError, TimeoutError):
            await term.wait_for(self.ready, timeout_s=timeout_s)
        return term

    def said(self, since: float, words: Sequence[str], *, most: int = 8) -> list[str]:
        """The distinct lines of every run since `since` that contain one of `words`, each
        with when it first came (seconds after `since`) and how often (the first `most`)."""
        found: dict[str, tuple[float, int]] = {}
        for term in self.runs:
            hits = {hit for word in words for hit in term.lines_with(word) if hit[0] >= since}
            for when, line in sorted(hits):
                first, count = found.get(line, (when, 0))
                found[line] = (first, count + 1)
        ordered = sorted(found.items(), key=lambda item: item[1][0])
        return [
            f"+{first - since:.1f} s {line}" + (f" (x{count})" if count > 1 else "")
            for line, (first, count) in ordered
        ][:most]

    def output(self) -> bytes:
        return b"".join(term.output for term in self.runs)


@dataclass
class ConsoleWriter:
    """Types numbered probes into a console and records when each is answered."""

    cli: Rerun
    answered: list[float] = field(default_factory=list)
    asked: list[float] = field(default_factory=list)
    """When each answered probe was typed (answered[i] answers asked[i])."""
    unanswered: list[int] = field(default_factory=list)
    count: int = 0

    def answered_since(self, when: float) -> bool:
        """Was a probe typed after `when` answered?"""
        return any(sent > when for sent in self.asked)

    async def probe(self, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
        """One probe (in a new run if the last one ended); True when the shell answered."""
        self.count += 1
        n = self.count
        term = await self.cli.current()
        after = len(term.output)
        sent = time.monotonic()
        try:
            term.write(f"echo probe-{n}-$(({n}*7))\r".encode())
            when = await term.wait_for(
                re.compile(f"probe-{n}-{n * 7}".encode()), after=after, timeout_s=timeout_s
            )
        except (TimeoutError, EOFError, OSError):
            self.unanswered.append(n)
            return False
        self.answered.append(when)
        self.asked.append(sent)
        return True

    async def keep_probing(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            if not await self.probe() and self.cli.runs[-1].process.returncode is not None:
                # A run that ended: the user reads why, then runs it again.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0):
                        await stop.wait()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(PROBE_EVERY_S):
                    await stop.wait()


@dataclass
class ForwardProber:
    """Fetches the guest's web page through a local forwarded port, again and again."""

    port: int
    cli: Rerun | None = None
    """The port-forward behind the port, run again if it exits."""
    answered: list[float] = field(default_factory=list)
    asked: list[float] = field(default_factory=list)
    """When each fetch that succeeded began."""
    failures: list[tuple[float, str]] = field(default_factory=list)

    def answered_since(self, when: float) -> bool:
        """Did a fetch begun after `when` succeed?"""
        return any(began > when for began in self.asked)

    async def fetch(self) -> bool:
        if self.cli is not None:
            await self.cli.current()
        began = time.monotonic()
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_S):
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
                try:
                    writer.write(b"GET / HTTP/1.0\r\nHost: vm1\r\n\r\n")
                    page = await reader.read()
                finally:
                    writer.close()
        except (OSError, TimeoutError) as exc:
            self.failures.append((time.monotonic(), type(exc).__name__))
            return False
        if b"hello from vm1" not in page:
            self.failures.append((time.monotonic(), f"answered {page[:60]!r}"))
            return False
        self.answered.append(time.monotonic())
        self.asked.append(began)
        return True

    async def keep_fetching(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.fetch()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(PROBE_EVERY_S):
                    await stop.wait()
