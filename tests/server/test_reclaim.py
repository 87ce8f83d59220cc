"""Memory comes back when sessions drain: a full collection and malloc_trim, at the right time.

The RSS figures over repeated bursts are in `bench_console`'s cycles table;
here what is checked is that the reclaim happens when it should (sessions
or connections drained, after the closing went quiet), at most as often as
it should, and that it really frees the garbage cycles closed sessions leave.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from subres.serving.reclaim import Reclaimer
from tests.support import Backend, machine, start_standalone, wait_for


class Cycle:
    """An object in a reference cycle, as aiohttp's per-connection objects are."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def no_automatic_gc() -> Iterator[None]:
    """Garbage cycles stay until someone collects them (as between Python's rare full runs)."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def test_draining_to_zero_collects_the_cycles_after_the_closing_goes_quiet(
    no_automatic_gc: None,
) -> None:
    reclaimer = Reclaimer(delay=0.05, min_interval=0, min_burst=5)
    for n in range(1, 6):
        reclaimer.level("sessions", n)
    for _ in range(10_000):
        Cycle()
    reclaimer.level("sessions", 4)
    reclaimer.level("sessions", 3)  # at most half the peak is low enough
    reclaimer.level("sessions", 1)
    reclaimer.level("sessions", 0)  # each drop postpones the reclaim: it runs once
    await wait_for(lambda: reclaimer.runs == 1)
    assert reclaimer.last is not None and reclaimer.last.collected >= 10_000
    await reclaimer.stop()


async def test_a_small_dip_is_no_reason_and_reclaims_are_spaced(no_automatic_gc: None) -> None:
    reclaimer = Reclaimer(delay=0.01, min_interval=3600, min_burst=8)
    reclaimer.level("connections", 4)
    reclaimer.level("connections", 0)  # not a burst
    reclaimer.level("connections", 10)
    reclaimer.level("connections", 6)  # not enough of a drop
    assert reclaimer.due is None
    # Read before the drop that starts it: the run comes later, however busy the loop.
    before = asyncio.get_running_loop().time()
    reclaimer.level("connections", 0)
    await wait_for(lambda: reclaimer.runs == 1)
    reclaimer.level("connections", 8)
    reclaimer.level("connections", 0)
    due = reclaimer.due
    assert due is not None and due >= before + 3600  # not within min_interval of the last
    await reclaimer.stop()
    assert reclaimer.due is None and reclaimer.runs == 1


async def test_sessions_that_end_trigger_a_reclaim(tmp_path: Path, backend: Backend) -> None:
    machines = [machine(f"vm{i}", console=backend.url) for i in range(20)]
    async with start_standalone(tmp_path, *machines) as subres:
        reclaimer = subres.server.state.reclaimer
        reclaimer.delay, reclaimer.min_interval, reclaimer.min_burst = 0.05, 0, 10
        runs = reclaimer.runs
        async with contextlib.AsyncExitStack() as stack:
            for i in range(20):
                ws = await stack.enter_async_context(subres.websocket(subres.url(f"vm{i}")))
                await ws.send(b"x")
                assert await ws.recv() == b"x"
            await backend.wait_open(20)
            assert reclaimer.runs == runs  # nothing drained yet
        await wait_for(lambda: len(subres.server.state.sessions) == 0)
        await wait_for(lambda: reclaimer.runs > runs)
        assert reclaimer.last is not None and reclaimer.last.collected > 0
