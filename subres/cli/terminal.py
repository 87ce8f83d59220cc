"""The local terminal: raw mode, its size, and signals that reach a session.

Owns putting a TTY into raw mode for the length of a session (and always
putting it back), reading the window size, and turning signals such as
SIGWINCH into callbacks on the running asyncio loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import termios
import tty
from collections.abc import Callable, Iterable, Iterator

from subres.protocol.channels import TerminalSize

__all__ = ["on_signals", "raw_mode", "size"]


@contextlib.contextmanager
def raw_mode(fd: int) -> Iterator[None]:
    """Raw mode on the terminal `fd` inside the block; the old mode after, whatever happens."""
    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd)
        yield
    finally:
        # TCSADRAIN: output already written keeps its raw-mode meaning.
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def size(fd: int) -> TerminalSize:
    """The terminal's width and height in character cells."""
    columns, lines = os.get_terminal_size(fd)
    return TerminalSize(width=columns, height=lines)


@contextlib.contextmanager
def on_signals(signals: Iterable[int], callback: Callable[[], None]) -> Iterator[None]:
    """Call `callback` on the running loop for each of `signals` inside the block."""
    loop = asyncio.get_running_loop()
    installed = list(signals)
    for sig in installed:
        loop.add_signal_handler(sig, callback)
    try:
        yield
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
