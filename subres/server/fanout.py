"""Asking every other replica at once: the sessions list and the recordings are fan-outs.

Each member is asked over the peer port (`server.peer`) in parallel, within
`TIMEOUT`, and its answer is read whole (`backends.peer`). A member that
does not answer, whose answer is cut short, or whose listing cannot be
parsed (`listed`) is left out of the result, logged, counted
(`subres_peer_answers_failed_total`) and named in a `Warning` header
(`warning`), so that an answer is never silently partial.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from subres.backends.peer import AnswerCut
from subres.server.state import State

__all__ = ["TIMEOUT", "Answers", "ask_others", "listed", "warning"]

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
            cut = isinstance(result, AnswerCut)
            state.metrics.peer_answers_failed.labels("cut" if cut else "unreachable").inc()
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


def listed(state: State, answers: Answers, path: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The `items` of every listing the others answered with 200, and who failed (no answer,
    a cut one, one that is not a listing, another status)."""
    items: list[dict[str, Any]] = []
    failed = [*answers.failed, *answers.status]
    for member, body in answers.ok.items():
        try:
            listing = json.loads(body)["items"]
            if not isinstance(listing, list):
                raise TypeError(f"items is a {type(listing).__name__}")
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("replica %s answered %s with no listing: %s", member, path, exc)
            state.metrics.peer_answers_failed.labels("unparsable").inc()
            failed.append(member)
            continue
        items += [i for i in listing if isinstance(i, dict)]
    return items, failed


def warning(failed: Sequence[str]) -> dict[str, str]:
    """The `Warning` header naming the replicas that did not answer (none when all did)."""
    if not failed:
        return {}
    names = ", ".join(sorted(failed))
    return {"Warning": f'299 - "incomplete: replicas {names} did not answer"'}
