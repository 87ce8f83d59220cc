"""Asking every other replica at once: the sessions list and the recordings are fan-outs.

Each member is asked over the peer port (`server.peer`) in parallel, within
`TIMEOUT`. A member that does not answer is left out of the result and
named in a `Warning` header (`warning`), so that an answer is never
silently partial.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from subres.server.state import State

__all__ = ["TIMEOUT", "Answers", "ask_others", "warning"]

log = logging.getLogger(__name__)

TIMEOUT = 2.0
"""Seconds a fan-out waits for the other replicas."""


@dataclass
class Answers:
    """What the other replicas answered: bodies of 200s by member, and who failed."""

    ok: dict[str, bytes]
    status: dict[str, int]
    """The other answers' status codes (404: not there)."""
    failed: dict[str, str]


async def ask_others(state: State, path: str, *, limit: int) -> Answers:
    """GET `path` of every other member, in parallel, within `TIMEOUT`."""
    others = state.owners.others()
    results = await asyncio.gather(
        *(_ask(state, member, path, limit=limit) for member in others), return_exceptions=True
    )
    answers = Answers({}, {}, {})
    for member, result in zip(others, results, strict=True):
        if isinstance(result, BaseException):
            reason = str(result) or type(result).__name__
            log.warning("replica %s did not answer %s: %s", member, path, reason)
            answers.failed[member] = reason
        elif result[0] == 200:
            answers.ok[member] = result[1]
        else:
            answers.status[member] = result[0]
    return answers


async def _ask(state: State, member: str, path: str, *, limit: int) -> tuple[int, bytes]:
    address = state.owners.addresses.get(member)
    if address is None:
        raise OSError("it has no address")
    async with asyncio.timeout(TIMEOUT):
        return await state.peers.get(address, path, limit=limit)


def warning(failed: Sequence[str]) -> dict[str, str]:
    """The `Warning` header naming the replicas that did not answer (none when all did)."""
    if not failed:
        return {}
    names = ", ".join(sorted(failed))
    return {"Warning": f'299 - "incomplete: replicas {names} did not answer"'}
