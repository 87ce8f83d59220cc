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
chunk received.
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
        self._heard_at = self._next_beat = self._loop.time()
        self._handle: asyncio.TimerHandle | None = None

    @property
    def silence(self) -> float:
        """Seconds of silence after which the peer is given up."""
        return self._interval * relay.MISSED_BEATS

    def start(self) -> None:
        """Beat now, and every interval until `stop` or the peer is given up."""
        self._heard_at = self._next_beat = self._loop.time()
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
        now = self._loop.time()
        if not self._reading():
            self._heard_at = now  # nothing is read, so nothing can be missed
        if now - self._heard_at >= self.silence:
            self._handle = None
            self._expire(f"nothing arrived for {self.silence:g}s")
            return
        if now >= self._next_beat:
            self._beat()
            self._next_beat = now + self._interval
        due = min(self._next_beat, self._heard_at + self.silence)
        self._handle = self._loop.call_at(due, self._tick)
