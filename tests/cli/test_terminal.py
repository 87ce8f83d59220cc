"""The local terminal helpers on a real pseudo-terminal pair."""

from __future__ import annotations

import asyncio
import fcntl
import os
import pty
import signal
import struct
import termios
from collections.abc import Iterator

import pytest

from subres.cli import terminal
from subres.protocol.channels import TerminalSize

SIGNAL_WAIT = 10.0


@pytest.fixture
def tty_fd() -> Iterator[int]:
    """The follower side of a fresh pseudo-terminal."""
    leader, follower = pty.openpty()
    try:
        yield follower
    finally:
        os.close(follower)
        os.close(leader)


def test_raw_mode_is_undone_even_on_errors(tty_fd: int) -> None:
    before = termios.tcgetattr(tty_fd)
    with pytest.raises(RuntimeError), terminal.raw_mode(tty_fd):
        lflag = termios.tcgetattr(tty_fd)[3]
        assert not lflag & (termios.ICANON | termios.ECHO | termios.ISIG)
        raise RuntimeError("session failed")
    assert termios.tcgetattr(tty_fd) == before


def test_size_reads_the_window(tty_fd: int) -> None:
    fcntl.ioctl(tty_fd, termios.TIOCSWINSZ, struct.pack("HHHH", 33, 101, 0, 0))
    assert terminal.size(tty_fd) == TerminalSize(width=101, height=33)


async def test_signals_reach_the_callback_until_the_block_ends() -> None:
    seen = asyncio.Event()
    with terminal.on_signals((signal.SIGWINCH,), seen.set):
        os.kill(os.getpid(), signal.SIGWINCH)
        async with asyncio.timeout(SIGNAL_WAIT):
            await seen.wait()
    assert signal.getsignal(signal.SIGWINCH) == signal.SIG_DFL
