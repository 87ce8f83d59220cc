"""Saying how long a session has left, when a limit of the server's is near.

The server's answer to the upgrade says which limits are in force
(`Subres-Session-Seconds-Left`: the session's maximum duration from now;
`Subres-Idle-Timeout`: how long it may go without input). Once fewer than
`WARN` seconds remain, `watch` says so (the maximum duration again at each
of `STEPS`), so that nobody loses a session without warning.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping

__all__ = ["STEPS", "WARN", "watch"]

WARN = 60.0
"""Seconds left when the first warning is said."""
STEPS = (60.0, 30.0, 10.0)
"""Seconds left at which it is said."""
DURATION_HEADER = "Subres-Session-Seconds-Left"
IDLE_HEADER = "Subres-Idle-Timeout"


async def watch(
    headers: Mapping[str, str],
    *,
    say: Callable[[str], None],
    last_input: Callable[[], float] | None,
) -> None:
    """Say the time left as limits near; `last_input` (monotonic) for the idle timeout, None
    for a session that sends no input. Returns when no limit is left to watch."""
    headers = {name.lower(): value for name, value in headers.items()}
    tasks = []
    duration = _seconds(headers.get(DURATION_HEADER.lower()))
    if duration is not None:
        tasks.append(_duration(time.monotonic() + duration, say))
    idle = _seconds(headers.get(IDLE_HEADER.lower()))
    if idle is not None and last_input is not None:
        tasks.append(_idle(idle, say, last_input))
    if tasks:
        await asyncio.gather(*tasks)


async def _duration(deadline: float, say: Callable[[str], None]) -> None:
    said = False
    for step in STEPS:
        left = deadline - time.monotonic()
        if left > step:
            await asyncio.sleep(left - step)  # until that many seconds are left
        elif said:
            continue
        said = True
        say(f"the session ends in {deadline - time.monotonic():.0f}s: its maximum duration")


async def _idle(idle: float, say: Callable[[str], None], last_input: Callable[[], float]) -> None:
    warned = 0.0  # the input time already warned about
    ahead = min(WARN, idle / 2)  # a short timeout is warned about halfway
    while True:
        since = last_input()
        due = since + idle - ahead
        now = time.monotonic()
        if now < due or since == warned:
            # Nothing to say yet, or said already for this quiet spell: look again later.
            await asyncio.sleep(max(due - now, 1.0))
            continue
        warned = since
        left = since + idle - now
        say(f"no input for {now - since:.0f}s: the session ends in {left:.0f}s unless you type")


def _seconds(text: str | None) -> float | None:
    """A header's positive number of seconds, or None (absent or not a number)."""
    try:
        value = float(text) if text is not None else None
    except ValueError:
        return None
    return value if value is not None and 0 < value < 1e9 else None
