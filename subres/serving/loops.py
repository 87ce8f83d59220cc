"""Which event loop a listening program runs on: uvloop by default, or asyncio's own.

`subres serve` and `subres agent` take `--loop` (or `SUBRES_LOOP`). uvloop
is the default because it spends less CPU per relayed byte and per session
(docs/performance.md has the figures); asyncio's loop stays supported, and
tested, for platforms without uvloop wheels and for debugging.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from subres.engine import internals

__all__ = ["DEFAULT", "ENV", "LOOPS", "add_argument", "factory", "run"]

LOOPS = ("uvloop", "asyncio")
DEFAULT = "uvloop"
ENV = "SUBRES_LOOP"
"""The environment variable that chooses the loop when `--loop` is not given."""

T = TypeVar("T")


def add_argument(parser: argparse.ArgumentParser) -> None:
    """`--loop`, defaulting to `$SUBRES_LOOP`, else `DEFAULT`."""
    default = os.environ.get(ENV) or DEFAULT
    parser.add_argument(
        "--loop",
        choices=LOOPS,
        default=default if default in LOOPS else DEFAULT,
        help=f"event loop: uvloop (default) or asyncio; ${ENV} sets the default",
    )


def factory(loop: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """What makes a new loop of that name; None for asyncio's default."""
    if loop == "uvloop":
        import uvloop

        internals.check_version("uvloop")
        return uvloop.new_event_loop
    if loop != "asyncio":
        raise ValueError(f"unknown event loop {loop!r}: one of {', '.join(LOOPS)}")
    return None


def run(main: Coroutine[Any, Any, T], *, loop: str) -> T:
    """Run `main` to its end on a new loop of that name, as `asyncio.run` does."""
    with asyncio.Runner(loop_factory=factory(loop)) as runner:
        return runner.run(main)
