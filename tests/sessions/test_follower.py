"""A log follower's memory: what it holds counts what its reader took and has not sent."""

from __future__ import annotations

from subres.sessions.follower import Follower

AT = 7


def follower(limit: int, dropped: list[bool]) -> Follower:
    return Follower(limit=limit, abort=lambda: dropped.append(True), clock=lambda: AT)


async def test_a_reader_stuck_sending_is_cut_off_and_dropped_at_the_limit() -> None:
    dropped: list[bool] = []
    stuck = follower(100, dropped)
    stuck.output(b"a" * 60)
    assert await stuck.next() == [(b"a" * 60, AT)]
    stuck.output(b"b" * 30)  # 90 held: 60 taken and not sent yet, 30 queued
    assert not stuck.cut_off
    stuck.output(b"c" * 20)
    assert (stuck.cut_off, stuck.reason, dropped) == (
        True,
        "fell more than 100 bytes behind the console",
        [True],
    )
    assert await stuck.next() is None


async def test_a_reader_that_keeps_up_is_never_cut_off() -> None:
    dropped: list[bool] = []
    steady = follower(100, dropped)
    for _ in range(20):
        steady.output(b"x" * 60)
        assert await steady.next() is not None
        steady.sent()
    assert not steady.cut_off and not dropped


async def test_a_reader_behind_with_nothing_in_flight_is_told_why_not_dropped() -> None:
    dropped: list[bool] = []
    slow = follower(100, dropped)
    slow.output(b"a" * 60)
    slow.output(b"b" * 60)
    assert slow.cut_off and not dropped
    assert await slow.next() is None
