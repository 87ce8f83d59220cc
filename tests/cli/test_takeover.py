"""`subres console` in a terminal asks before taking a console from its writer, as the page does.

A piped `subres console` holds the demo's console as its writer (its stdin
kept open); a second, interactive one is asked, and the answer decides: keep
out, watch, or take over. `--force` and scripts are never asked, and a writer
that is taken over reads why on a line of its own.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pexpect  # type: ignore[import-untyped]
import pytest

from tests.cli.conftest import (
    CLI_TIMEOUT,
    Demo,
    cli,
    cli_env,
    read_until,
    run_cli,
    running_demo,
)

QUESTION = rb"In use by demo since \d\d:\d\d \xe2\x80\x94 take over\? \[y/N/o\(bserve\)\] "


@pytest.fixture(scope="module")
def demo() -> Iterator[Demo]:
    """A demo of this module's own: its tests take its console from each other."""
    with running_demo() as running:
        yield running


class Writer:
    """A piped `subres console demo` that writes on the console until it is closed."""

    def __init__(self, demo: Demo, home: Path) -> None:
        self.proc = subprocess.Popen(
            cli("--kubeconfig", demo.kubeconfig, "console", "demo"),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=cli_env(home),
        )
        self.say("echo writer-$((20+1))")
        read_until(self.proc, rb"writer-21", timeout=CLI_TIMEOUT)

    def say(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(CLI_TIMEOUT)
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            assert pipe is not None
            pipe.close()


@pytest.fixture
def writer(demo: Demo, workdir: Path) -> Iterator[Writer]:
    held = Writer(demo, workdir)
    try:
        yield held
    finally:
        held.close()


def take_over(demo: Demo, home: Path) -> subprocess.CompletedProcess[bytes]:
    """A script's console session: it takes over, unasked, and exits."""
    return run_cli(["--kubeconfig", demo.kubeconfig, "console", "demo"], home=home, stdin=b"exit\n")


def interactive(demo: Demo, home: Path, *flags: str) -> pexpect.spawn:
    argv = cli("--kubeconfig", demo.kubeconfig, "console", "demo", *flags)
    return pexpect.spawn(
        argv[0], argv[1:], env=cli_env(home), timeout=CLI_TIMEOUT, dimensions=(24, 80)
    )


def test_no_leaves_the_writer_alone(demo: Demo, workdir: Path, writer: Writer) -> None:
    child = interactive(demo, workdir)
    try:
        child.expect(QUESTION)
        child.sendline("")
        child.expect_exact(b"error: left the console of machine/demo to demo")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 1
    writer.say("echo still-$((6*7))")
    read_until(writer.proc, rb"still-42", timeout=CLI_TIMEOUT)


def test_observe_watches_what_the_writer_does(demo: Demo, workdir: Path, writer: Writer) -> None:
    child = interactive(demo, workdir)
    try:
        child.expect(QUESTION)
        child.sendline("o")
        child.expect_exact(b"Observing (read-only) machine/demo. Escape with Ctrl+]")
        writer.say("echo seen-by-$((1+1))")
        child.expect_exact(b"seen-by-2")
        child.send(b"\x1d")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
    assert writer.proc.poll() is None  # still the writer


def test_yes_takes_over_and_the_writer_is_told(demo: Demo, workdir: Path, writer: Writer) -> None:
    child = interactive(demo, workdir)
    try:
        child.expect(QUESTION)
        child.sendline("y")
        child.expect_exact(b"Connected to machine/demo")
        assert writer.proc.wait(CLI_TIMEOUT) == 1
        assert writer.proc.stderr is not None
        assert b"taken over by demo" in writer.proc.stderr.read()
        child.send(b"\x1d")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)


def test_force_and_scripts_are_never_asked(demo: Demo, workdir: Path, writer: Writer) -> None:
    child = interactive(demo, workdir, "--force")
    try:
        index = child.expect([QUESTION, rb"Connected to machine/demo"])
        assert index == 1, "--force asked"
        assert writer.proc.wait(CLI_TIMEOUT) == 1
        child.send(b"\x1d")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    # A script takes over as it always did: stdin is not a terminal, nobody to ask.
    second = Writer(demo, workdir)
    try:
        piped = take_over(demo, workdir)
        assert piped.returncode == 0, piped.stderr
        assert b"take over?" not in piped.stderr
        assert second.proc.wait(CLI_TIMEOUT) == 1
    finally:
        second.close()


def test_the_taken_over_writer_reads_why_on_a_line_of_its_own(demo: Demo, workdir: Path) -> None:
    child = interactive(demo, workdir, "--force")
    try:
        child.expect_exact(b"demo$ ")  # the shell's prompt: the cursor stays after it
        taker = take_over(demo, workdir)
        assert taker.returncode == 0, taker.stderr
        child.expect(pexpect.EOF)
        seen = child.before
    finally:
        child.close(force=True)
    line = re.search(rb"([^\n]*)error: [^\n]*taken over by demo", seen)
    assert line is not None, seen
    assert line.group(1) in (b"", b"\r"), seen
