"""A console's hub without sockets: feeds fill, wait, end and get cut off as promised."""

from __future__ import annotations

import asyncio

from subres.sessions.hub import OBSERVER_DELAY, Feed, Hub
from subres.sessions.scrollback import Scrollback


def make_hub(*, limit: int = 10, scrollback: Scrollback | None = None) -> tuple[Hub, list[Hub]]:
    idle: list[Hub] = []
    return Hub(on_idle=idle.append, scrollback=scrollback, feed_limit=limit), idle


async def test_every_feed_reads_what_was_published_in_order_and_at_once() -> None:
    hub, _ = make_hub(limit=100)
    first, second = hub.attach(), hub.attach()
    for chunk in (b"a", b"bc", b"def"):
        hub.publish(chunk)
    hub.end()
    for feed in (first, second):
        got = [await feed.read() for _ in range(2)]
        assert got == [b"abcdef", b""]


async def test_observers_are_woken_together_a_moment_after_the_output() -> None:
    hub, _ = make_hub(limit=100)
    feed = hub.attach()
    loop = asyncio.get_running_loop()
    published: list[float] = []

    def publish() -> None:
        published.append(loop.time())
        hub.publish(b"late")

    reading = asyncio.create_task(feed.read())
    loop.call_soon(publish)  # runs once the reader waits (callbacks run in order)
    async with asyncio.timeout(1):
        assert await reading == b"late"
    assert loop.time() - published[0] >= OBSERVER_DELAY * 0.9


async def test_a_feed_past_its_limit_is_cut_and_its_session_closed() -> None:
    hub, _ = make_hub(limit=10)
    feed = hub.attach()
    closed: list[tuple[int, str]] = []
    feed.attached(lambda code, reason: closed.append((code, reason)))
    hub.publish(b"x" * 8)
    hub.publish(b"y" * 8)
    assert closed == [(4002, "fell more than 10 bytes behind the console")]
    assert feed.queued == 0
    # A cut feed never hands out more: its client is being closed.
    reading = asyncio.create_task(feed.read())
    await asyncio.sleep(0)
    assert not reading.done()
    reading.cancel()


async def test_a_cut_before_the_session_started_closes_it_once_it_does() -> None:
    hub, _ = make_hub(limit=1)
    feed = hub.attach()
    hub.publish(b"ab")
    hub.publish(b"cd")
    closed: list[int] = []
    feed.attached(lambda code, _reason: closed.append(code))
    assert closed == [4002]


async def test_put_waits_for_room_instead_of_cutting() -> None:
    hub, _ = make_hub(limit=4)
    feed = Feed(hub, limit=4)
    await feed.put(b"1234")
    blocked = asyncio.create_task(feed.put(b"5678"))
    await asyncio.sleep(0)
    assert not blocked.done()
    assert await feed.read() == b"1234"
    async with asyncio.timeout(1):
        await blocked
    assert await feed.read() == b"5678"


async def test_attaching_replays_the_scrollback_tail() -> None:
    hub, _ = make_hub(limit=1000, scrollback=Scrollback(100))
    hub.publish(b"one\ntwo\nthree\n")
    assert await hub.attach(tail=2).read() == b"two\nthree\n"
    assert await hub.attach().read() == b"one\ntwo\nthree\n"


async def test_the_hub_says_when_it_is_idle() -> None:
    hub, idle = make_hub()
    feed = hub.attach()
    await feed.close()
    assert idle == [hub]
