"""Serial-over-LAN payloads and their flow (IPMI v2.0, sections 15.8-15.10).

An SOL payload is four bytes and the characters:

    sequence (4 bits, 0 = ack-only) | ack/nack sequence | accepted count | operation/status | data

Each direction keeps one packet in flight: it is acknowledged with the
number of characters the receiver accepted, and a partial count has the rest
sent again under the next sequence number; a packet nobody acknowledges is
sent again with the same number, `retries` times, before the BMC counts as
gone. A BMC that sends a number it sent before (our ACK was lost) gets the
same ACK again and its characters are not delivered twice.

Flow control: `Sol` hands received characters on only while fewer than
`window` of them wait unconsumed (`consumed` says when the reader took some),
and acknowledges only what it handed on. With no room at all it NACKs the
packet, which makes the BMC hold its data and stop reading the serial port,
instead of resending until it gives up and drops characters. Once room is
back it ACKs the BMC's next sequence number with a count of 0, which has the
BMC send its held data again (how OpenIPMI's BMC resumes). The CTS pause bit
is not used: the NACK already holds the BMC. The other way, a BMC that NACKs
our packet or says "character transfer unavailable" gets nothing more for a
retry interval.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass

from subres.protocol.ipmi.errors import Fault, HandshakeError, PacketError

__all__ = ["Control", "Frame", "Sol", "Status", "next_sequence"]

HEADER = 4
MAX_CHUNK = 255
"""The accepted character count is one byte: no packet may carry more."""


class Control(enum.IntFlag):
    """Operation bits of a packet from the remote console (table 15-2)."""

    NACK = 0x40
    RING = 0x20
    BREAK = 0x10
    CTS_PAUSE = 0x08
    DROP_DCD_DSR = 0x04
    FLUSH_INBOUND = 0x02
    FLUSH_OUTBOUND = 0x01


class Status(enum.IntFlag):
    """Status bits of a packet from the BMC (table 15-2)."""

    NACK = 0x40
    UNAVAILABLE = 0x20
    DEACTIVATING = 0x10
    OVERRUN = 0x08
    BREAK = 0x04


@dataclass(frozen=True)
class Frame:
    """One SOL payload."""

    sequence: int = 0
    ack: int = 0
    accepted: int = 0
    flags: int = 0
    data: bytes = b""

    def encode(self) -> bytes:
        """The payload's bytes."""
        head = bytes([self.sequence & 0x0F, self.ack & 0x0F, self.accepted & 0xFF, self.flags])
        return head + self.data

    @classmethod
    def decode(cls, payload: bytes) -> Frame:
        """A `Frame`; `PacketError` when shorter than its header or carrying more than 255."""
        if len(payload) < HEADER:
            raise PacketError(f"an SOL payload of {len(payload)} bytes is short")
        if len(payload) > HEADER + MAX_CHUNK:
            raise PacketError(f"an SOL payload of {len(payload)} bytes is longer than any")
        return cls(payload[0] & 0x0F, payload[1] & 0x0F, payload[2], payload[3], payload[4:])


def next_sequence(sequence: int) -> int:
    """The sequence number after `sequence`: 1 to 15, then 1 again (0 means ack-only)."""
    return sequence % 15 + 1


@dataclass
class _InFlight:
    frame: Frame
    deadline: float
    sends: int = 1


class Sol:
    """Both directions of one activated SOL payload, without I/O.

    `receive` and `tick` return the frames to send and fill `delivered` with
    the characters for the reader; the caller passes the time as `now`.
    """

    def __init__(self, *, max_chunk: int, window: int, retry_interval: float, retries: int) -> None:
        self.max_chunk = max(1, min(max_chunk, MAX_CHUNK))
        self.window = window
        self.retry_interval = retry_interval
        self.retries = retries
        self.delivered: deque[bytes] = deque()
        self.status = Status(0)
        """The status bits of the last packet from the BMC."""
        self.breaks = 0
        """Breaks the BMC reported on the serial line."""
        self.overruns = 0
        """Packets in which the BMC said it dropped characters."""
        self._pending = bytearray()
        self._flight: _InFlight | None = None
        self._sequence = 0
        self._unconsumed = 0
        self._last_seq = 0
        self._last_count = 0
        self._nacked = 0
        self._break = False
        self._held_until = 0.0
        """While the BMC's buffer is full (it NACKed), nothing is sent before this time."""

    # the reader's side -------------------------------------------------------

    def send(self, data: bytes, now: float) -> list[Frame]:
        """Queue characters for the serial port; the frames to send now."""
        self._pending += data
        return self._transmit(now)

    def send_break(self, now: float) -> list[Frame]:
        """A break on the serial line: with the next data packet, or in an ack-only packet.

        A packet with a sequence number and no characters is never acknowledged
        (OpenIPMI's BMC does not), so a lone break travels unsequenced.
        """
        if self.unsent:
            self._break = True
            return self._transmit(now)
        return [Frame(ack=self._last_seq, accepted=self._last_count, flags=Control.BREAK)]

    def consumed(self, count: int) -> list[Frame]:
        """The reader took `count` delivered characters; a NACKed BMC may send again."""
        self._unconsumed = max(0, self._unconsumed - count)
        if not self._nacked or self._unconsumed >= self.window:
            return []
        resume = Frame(ack=next_sequence(self._nacked))
        self._nacked = 0
        return [resume]

    @property
    def unsent(self) -> int:
        """Characters queued or in flight, not yet accepted by the BMC."""
        flight = len(self._flight.frame.data) if self._flight is not None else 0
        return len(self._pending) + flight

    def deadline(self) -> float | None:
        """When `tick` must run next (a retransmission, or held data), or None."""
        if self._flight is not None:
            return self._flight.deadline
        return self._held_until if self._pending else None

    def tick(self, now: float) -> list[Frame]:
        """Send an unacknowledged packet again; `HandshakeError` once retries are spent."""
        flight = self._flight
        if flight is None:
            return self._transmit(now)
        if now < flight.deadline:
            return []
        if flight.sends > self.retries:
            raise HandshakeError(
                f"the BMC acknowledged no SOL packet in {flight.sends} tries", Fault.TIMEOUT
            )
        flight.sends += 1
        flight.deadline = now + self.retry_interval
        return [flight.frame]

    # the BMC's side ----------------------------------------------------------

    def receive(self, frame: Frame, now: float) -> list[Frame]:
        """A packet from the BMC: its ACK of ours, its characters; the frames to send."""
        self.status = Status(frame.flags & 0x7C)
        if frame.flags & Status.UNAVAILABLE:
            # The BMC cannot take characters now: hold ours for a retry interval.
            self._held_until = now + self.retry_interval
        if frame.flags & Status.BREAK:
            self.breaks += 1
        if frame.flags & Status.OVERRUN:
            self.overruns += 1
        out: list[Frame] = []
        ack = self._accept(frame) if frame.sequence and frame.data else None
        if self._flight is not None and frame.ack == self._flight.frame.sequence:
            self._acknowledged(self._flight, frame, now)
            out += self._transmit(now, ack)
            ack = None if out else ack
        if ack is not None:
            out.append(ack)
        return out

    def _accept(self, frame: Frame) -> Frame:
        """Take what fits of a BMC packet: the ACK (or NACK) to answer it with."""
        if frame.sequence == self._last_seq:
            return Frame(ack=frame.sequence, accepted=self._last_count)
        room = self.window - self._unconsumed
        if room <= 0:
            self._nacked = frame.sequence
            self._last_seq = 0
            return Frame(ack=frame.sequence, flags=Control.NACK)
        taken = frame.data[:room]
        self.delivered.append(taken)
        self._unconsumed += len(taken)
        self._last_seq, self._last_count = frame.sequence, len(taken)
        return Frame(ack=frame.sequence, accepted=len(taken))

    def _acknowledged(self, flight: _InFlight, frame: Frame, now: float) -> None:
        """The BMC answered our packet in flight: requeue what it did not accept."""
        sent = flight.frame.data
        # OpenIPMI's BMC sets NACK on an ACK whose count filled its buffer: the count is
        # what it took, so it is trusted (sending those characters again would repeat them).
        accepted = min(frame.accepted, len(sent))
        self._pending[:0] = sent[accepted:]
        self._flight = None
        if frame.flags & Status.NACK and accepted < len(sent):
            # The BMC's buffer is full: hold the rest until a retry interval has passed.
            self._held_until = now + self.retry_interval

    def _transmit(self, now: float, ack: Frame | None = None) -> list[Frame]:
        """The next data packet, if none is in flight; it carries `ack` along."""
        if self._flight is not None or not (self._pending or self._break):
            return []
        if now < self._held_until:
            return []
        chunk = bytes(self._pending[: self.max_chunk])
        del self._pending[: len(chunk)]
        self._sequence = next_sequence(self._sequence)
        flags = Control.BREAK if self._break else 0
        self._break = False
        frame = Frame(
            self._sequence,
            ack=ack.ack if ack else 0,
            accepted=ack.accepted if ack else 0,
            flags=flags | (ack.flags if ack else 0),
            data=chunk,
        )
        self._flight = _InFlight(frame, now + self.retry_interval)
        return [frame]
