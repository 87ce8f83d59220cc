"""Liveness of one long-lived relay connection: beat while quiet, drop a silent peer.

A network cut, or a peer whose host vanished, sends no FIN: TCP alone keeps
such a connection for many minutes (keepalive probes only idle connections;
unacknowledged data is retransmitted for about 15). TCP_USER_TIMEOUT would
end it sooner, but it also ends a connection whose live peer merely stopped
reading (a zero window), and backpressure makes that normal on a relay: a
slow client pauses its relay's reads. So both ends of a relay send a frame
of their own every `interval` (`protocol.relay`'s HEARTBEAT) and drop the
connection once, while they were reading, nothing at all arrived for
`relay.MISSED_BEATS` intervals. While reading is paused (backpressure) the
count stops: what is not read cannot be heard.

One timer per connection, due at the next beat or at the moment the peer
would have been silent too long, whichever comes first; one clock read per
chunk received. A beat that would fall due with the deadline (within half an
interval of it) waits for it: a peer about to be given up is not beaten to,
and a timer's clock, read a hair before the instant the timer was due for,
cannot send that beat first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from subres.protocol import relay

__all__ = ["Heartbeat"]


class Heartbeat:
    """Beats through `beat()` every `interval`; calls `expire(reason)` once the peer fell silent.

    The connection calls `heard()` on every chunk received; `reading()` says
    whether it reads at all (False while backpressure pauses it).
    """

    __slots__ = (
        "_beat",
        "_due",
        "_expire",
        "_handle",
        "_heard_at",
        "_interval",
        "_loop",
        "_next_beat",
        "_reading",
    )

    def __init__(
        self,
        interval: float,
        *,
        beat: Callable[[], None],
        expire: Callable[[str], None],
        reading: Callable[[], bool],
    ) -> None:
        self._interval = interval
        self._beat = beat
        self._expire = expire
        self._reading = reading
        self._loop = asyncio.get_running_loop()
        self._heard_at = self._next_beat = self._due = self._loop.time()
        self._handle: asyncio.TimerHandle | None = None

    @property
    def silence(self) -> float:
        """Seconds of silence after which the peer is given up."""
        return self._interval * relay.MISSED_BEATS

    def start(self) -> None:
        """Beat now, and every interval until `stop` or the peer is given up."""
        self._heard_at = self._next_beat = self._due = self._loop.time()
        self._tick()

    def stop(self) -> None:
        """No more beats or checks (the connection ended)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def heard(self) -> None:
        """Something arrived from the peer."""
        self._heard_at = self._loop.time()

    def _tick(self) -> None:
        # The loop runs a timer up to its clock's resolution early: the instant it was due
        # for is the one that counts.
        now = max(self._loop.time(), self._due)
        if not self._reading():
            self._heard_at = now  # nothing is read, so nothing can be missed
        deadline = self._heard_at + self.silence
        if now >= deadline:
            self._handle = None
            self._expire(f"nothing arrived for {self.silence:g}s")
            return
        if now >= self._next_beat:
            self._beat()
            self._next_beat = now + self._interval
        beat_first = self._next_beat < deadline - self._interval / 2
        self._due = self._next_beat if beat_first else deadline
        self._handle = self._loop.call_at(self._due, self._tick)
