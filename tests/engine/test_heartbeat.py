"""A relay's heartbeat: it beats every interval, gives a silent peer up after
`MISSED_BEATS` of them, and never one it hears or does not read."""

from __future__ import annotations

import asyncio

from subres.engine.heartbeat import Heartbeat
from subres.protocol import relay

INTERVAL = 0.02
CLOCK_SLACK = 0.002


class Peer:
    """What a connection tells its heartbeat, and what the heartbeat did to it."""

    def __init__(self) -> None:
        self.beats = 0
        self.reading = True
        self.expired: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.beaten = asyncio.Event()

    def heartbeat(self) -> Heartbeat:
        return Heartbeat(INTERVAL, beat=self.beat, expire=self.expire, reading=lambda: self.reading)

    def beat(self) -> None:
        self.beats += 1
        self.beaten.set()

    def expire(self, reason: str) -> None:
        self.expired.set_result(reason)
        self.beaten.set()


async def beats(peer: Peer, count: int) -> None:
    async with asyncio.timeout(5):
        while peer.beats < count and not peer.expired.done():
            peer.beaten.clear()
            await peer.beaten.wait()


async def test_a_silent_peer_is_given_up_after_the_missed_beats() -> None:
    loop = asyncio.get_running_loop()
    peer = Peer()
    heartbeat = peer.heartbeat()
    started = loop.time()
    heartbeat.start()
    async with asyncio.timeout(5):
        reason = await peer.expired
    silent_for = loop.time() - started
    assert reason == f"nothing arrived for {INTERVAL * relay.MISSED_BEATS:g}s"
    # Never before the whole silence ran out (less a timer's clock resolution: the loop
    # may run a timer a millisecond early).
    assert silent_for >= INTERVAL * relay.MISSED_BEATS - CLOCK_SLACK
    # A beat at the start and one per interval, but none with the deadline: a busy loop
    # that runs the timers late beats fewer times, never more.
    assert 1 <= peer.beats <= relay.MISSED_BEATS


async def test_a_peer_heard_from_is_kept_and_beaten_to() -> None:
    peer = Peer()
    heartbeat = peer.heartbeat()
    heartbeat.start()
    for count in range(2, 4 * relay.MISSED_BEATS):
        await beats(peer, count)
        heartbeat.heard()
    assert not peer.expired.done()
    heartbeat.stop()


async def test_while_nothing_is_read_nothing_is_missed() -> None:
    peer = Peer()
    peer.reading = False
    heartbeat = peer.heartbeat()
    heartbeat.start()
    await beats(peer, 4 * relay.MISSED_BEATS)
    assert not peer.expired.done()
    # Reading again, the count starts afresh: a whole silence before the peer is given up.
    loop = asyncio.get_running_loop()
    peer.reading = True
    resumed = loop.time()
    async with asyncio.timeout(5):
        await peer.expired
    assert loop.time() - resumed >= INTERVAL * (relay.MISSED_BEATS - 1) - CLOCK_SLACK


async def test_a_stopped_heartbeat_neither_beats_nor_expires() -> None:
    peer = Peer()
    heartbeat = peer.heartbeat()
    heartbeat.start()
    heartbeat.stop()
    await asyncio.sleep(INTERVAL * relay.MISSED_BEATS * 2)
    assert peer.beats == 1 and not peer.expired.done()
