"""One remote console's IPMI v2.0 session with a BMC, and the SOL payload on it, without I/O.

`Client` is the state machine; the caller feeds it datagrams (`receive`) and
the time (`tick`, at `deadline()`), and sends what `datagrams()` returns:

    IDLE ─start─▶ CAPABILITIES ─▶ OPENING ─▶ RAKP1 ─▶ RAKP3 ─▶ PRIVILEGE ─▶ ACTIVATING ─▶ ACTIVE
                  (Get Channel    (Open       (RAKP 2) (RAKP 4)  (Set Session    │   ▲
                   Auth Caps)      Session)                       Privilege)  0x80 │ once more
                                                                                   ▼   │
                                                          takeover: TAKING_OVER (Deactivate)
    ACTIVE ─close─▶ DEACTIVATING ─▶ CLOSING ─▶ CLOSED        any ─failure─▶ FAILED

Every request is sent again after `retry_interval` seconds, `retries` times,
before the BMC counts as gone. In ACTIVE, a keepalive (Get Payload Instance
Info) goes out after `keepalive` seconds without a packet from the BMC; it
also finds out whether another session deactivated ours. Packets for another
session ID, unprotected packets in a protected session, and anything
malformed are dropped and counted (`ignored`), as a BMC drops them.
"""

from __future__ import annotations

import enum
import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from subres.protocol.ipmi import wire
from subres.protocol.ipmi.crypto import AES_BLOCK, CipherSuite, Keys
from subres.protocol.ipmi.errors import Fault, HandshakeError, PacketError, UsageError
from subres.protocol.ipmi.events import (
    DataReceived,
    Event,
    PayloadActivated,
    PayloadDeactivated,
    SessionClosed,
    SessionFailed,
    SessionOpened,
    StaleSessionDeactivated,
)
from subres.protocol.ipmi.rakp import Exchange
from subres.protocol.ipmi.sol import Frame, Sol, Status
from subres.protocol.ipmi.wire import PayloadType

__all__ = ["COMPLETION", "Client", "Privilege", "Settings", "State"]

APP = 0x06
GET_DEVICE_ID = 0x01
GET_CHANNEL_AUTH_CAPABILITIES = 0x38
SET_SESSION_PRIVILEGE = 0x3B
CLOSE_SESSION = 0x3C
ACTIVATE_PAYLOAD = 0x48
DEACTIVATE_PAYLOAD = 0x49
GET_PAYLOAD_INSTANCE_INFO = 0x4B
SOL_INSTANCE = 1
REPLAY_WINDOW = 16
"""Session sequence numbers this far below the highest seen are refused as replays (the
spec's sliding window, section 6.12.13), as are numbers seen already."""
PAYLOAD_ACTIVE_ELSEWHERE = 0x80
COMPLETION = {
    0x80: "SOL payload already active on another session",
    0x81: "SOL payload is disabled",
    0x82: "SOL payload activation limit reached",
    0x83: "SOL cannot be activated with encryption",
    0x84: "SOL cannot be activated without encryption",
    0xC0: "node busy",
    0xC1: "invalid command",
    0xCC: "invalid data field in request",
    0xD4: "insufficient privilege level",
    0xD5: "command not supported in present state",
}
"""Completion codes of the commands sent here (tables 5-2 and 24-2)."""


class Privilege(enum.IntEnum):
    """Session privilege levels (table 6-1)."""

    CALLBACK = 1
    USER = 2
    OPERATOR = 3
    ADMINISTRATOR = 4


class State(enum.Enum):
    """Where the session is (see the module docstring's diagram)."""

    IDLE = "idle"
    CAPABILITIES = "capabilities"
    OPENING = "opening"
    RAKP1 = "rakp1"
    RAKP3 = "rakp3"
    PRIVILEGE = "privilege"
    ACTIVATING = "activating"
    TAKING_OVER = "taking over"
    ACTIVE = "active"
    DEACTIVATING = "deactivating"
    CLOSING = "closing"
    CLOSED = "closed"
    FAILED = "failed"


@dataclass(frozen=True)
class Settings:
    """Who logs in, how, and how patiently."""

    username: bytes
    password: bytes = field(repr=False)
    suite: CipherSuite
    privilege: Privilege = Privilege.ADMINISTRATOR
    takeover: bool = False
    """Deactivate SOL held by another session instead of failing with `Fault.BUSY`."""
    retry_interval: float = 1.0
    """Seconds before an unanswered request or SOL packet is sent again."""
    retries: int = 3
    """Sends after the first before the BMC counts as gone."""
    keepalive: float = 10.0
    """Seconds without a packet from the BMC before a keepalive request."""
    window: int = 65536
    """Received characters that may wait unconsumed before the BMC is NACKed."""


@dataclass
class _Request:
    payload_type: PayloadType
    payload: bytes
    command: int
    """The IPMI command answered, or -1 for a session establishment payload."""
    sequence: int
    deadline: float
    sends: int = 1


_ANSWERS = {
    PayloadType.OPEN_SESSION_REQUEST: PayloadType.OPEN_SESSION_RESPONSE,
    PayloadType.RAKP1: PayloadType.RAKP2,
    PayloadType.RAKP3: PayloadType.RAKP4,
}


class Client:
    """The remote console's end of one RMCP+ session carrying SOL."""

    def __init__(self, settings: Settings, *, random: Callable[[int], bytes] = os.urandom) -> None:
        self.settings = settings
        self.state = State.IDLE
        self.ignored = 0
        """Datagrams dropped: malformed, forged, for another session, or unexpected."""
        self._random = random
        self._exchange = Exchange(
            username=settings.username,
            password=settings.password,
            suite=settings.suite,
            privilege=settings.privilege,
            console_id=int.from_bytes(random(4), "little") | 1,
            console_random=random(16),
        )
        self._bmc_id = 0
        self._bmc_random = b""
        self._guid = b""
        self._keys: Keys | None = None
        self._outbox: list[bytes] = []
        self._request: _Request | None = None
        self._rq_seq = 0
        self._session_seq = 0
        self._heard = 0.0
        self._taken_over = False
        self._seen: deque[int] = deque(maxlen=REPLAY_WINDOW)
        self._highest = 0
        self.sol: Sol | None = None

    # the caller's side ----------------------------------------------------------

    def start(self, now: float) -> None:
        """Begin: ask the BMC's authentication capabilities (IPMI v2.0 extended data)."""
        if self.state is not State.IDLE:
            raise UsageError(f"start in state {self.state.value}")
        self._heard = now
        self.state = State.CAPABILITIES
        data = bytes([0x80 | 0x0E, self.settings.privilege])
        self._command(GET_CHANNEL_AUTH_CAPABILITIES, data, now)

    def datagrams(self) -> list[bytes]:
        """The datagrams to send now (each once)."""
        out, self._outbox = self._outbox, []
        return out

    def deadline(self) -> float | None:
        """When `tick` must run next, or None."""
        times = [r.deadline for r in (self._request,) if r is not None]
        if self.state is State.ACTIVE:
            times.append(self._heard + self.settings.keepalive)
            if self.sol is not None and (sol_deadline := self.sol.deadline()) is not None:
                times.append(sol_deadline)
        return min(times, default=None)

    def tick(self, now: float) -> list[Event]:
        """Retransmit, keep alive, or give up, as the time says."""
        if self.state in (State.CLOSED, State.FAILED, State.IDLE):
            return []
        try:
            return self._tick(now)
        except HandshakeError as exc:
            return self._failed(exc)

    def receive(self, datagram: bytes, now: float) -> list[Event]:
        """One datagram from the BMC: the events it caused."""
        if self.state in (State.CLOSED, State.FAILED, State.IDLE):
            return []
        try:
            packet = wire.parse(datagram, self._keys)
            self._check_session(packet)
        except PacketError:
            self.ignored += 1
            return []
        self._heard = now
        try:
            return self._dispatch(packet, now)
        except PacketError:
            self.ignored += 1
            return []
        except HandshakeError as exc:
            return self._failed(exc)

    def send(self, data: bytes, now: float) -> None:
        """Characters for the serial port."""
        self._sol_frames(self._active_sol().send(data, now))

    def send_break(self, now: float) -> None:
        """A break on the serial line."""
        self._sol_frames(self._active_sol().send_break(now))

    def consumed(self, count: int) -> None:
        """The reader took `count` characters of `DataReceived` events."""
        if self.sol is not None and self.state is State.ACTIVE:
            self._sol_frames(self.sol.consumed(count))

    def close(self, now: float) -> list[Event]:
        """End politely: deactivate SOL (if ours), then close the session."""
        if self.state in (State.CLOSED, State.FAILED, State.DEACTIVATING, State.CLOSING):
            return []
        if self.state is State.ACTIVE:
            self.state = State.DEACTIVATING
            self._command(DEACTIVATE_PAYLOAD, _payload_instance(), now)
        elif self._keys is not None:
            self._close_session(now)
        else:  # no session yet: nothing to tell the BMC
            self.state = State.CLOSED
            self._request = None
            return [SessionClosed()]
        return []

    # dispatch --------------------------------------------------------------

    def _check_session(self, packet: wire.Packet) -> None:
        keys = self._keys
        if keys is None:
            return
        if packet.session_id != self._exchange.console_id:
            raise PacketError(f"a packet for session {packet.session_id:#x}, not ours")
        if packet.authenticated != keys.authenticated or (keys.encrypted and not packet.encrypted):
            raise PacketError("a packet less protected than the session's cipher suite says")
        if keys.authenticated:
            self._not_replayed(packet.sequence)

    def _not_replayed(self, sequence: int) -> None:
        """Remember an authenticated packet's sequence number; `PacketError` for a replay."""
        if sequence in self._seen or sequence + REPLAY_WINDOW <= self._highest:
            raise PacketError(f"session sequence number {sequence} was seen or is too old")
        self._seen.append(sequence)
        self._highest = max(self._highest, sequence)

    def _dispatch(self, packet: wire.Packet, now: float) -> list[Event]:
        if packet.payload_type is PayloadType.SOL:
            return self._sol_received(packet.payload, now)
        request = self._request
        if request is None:
            raise PacketError("an answer to no request")
        if packet.payload_type is not PayloadType.IPMI:
            if _ANSWERS.get(request.payload_type) is not packet.payload_type:
                raise PacketError(f"an unexpected {packet.payload_type.name} payload")
            return self._established(packet.payload, now)
        message = wire.parse_message(packet.payload)
        if (message.netfn, message.command, message.sequence) != (
            APP | 1,
            request.command,
            request.sequence,
        ):
            raise PacketError("an IPMI response to no request of ours")
        self._request = None
        return self._answered(message, now)

    def _established(self, payload: bytes, now: float) -> list[Event]:
        """The next step of the RMCP+ handshake."""
        exchange = self._exchange
        self._request = None
        if self.state is State.OPENING:
            self._bmc_id = exchange.opened(payload)
            self.state = State.RAKP1
            self._send_payload(PayloadType.RAKP1, exchange.rakp1(self._bmc_id), now)
            return []
        if self.state is State.RAKP1:
            self._bmc_random, self._guid = exchange.rakp2(payload, self._bmc_id)
            self.state = State.RAKP3
            rakp3 = exchange.rakp3(self._bmc_id, self._bmc_random)
            self._send_payload(PayloadType.RAKP3, rakp3, now)
            return []
        keys = exchange.keys(self._bmc_random)
        exchange.rakp4(payload, keys=keys, bmc_id=self._bmc_id, guid=self._guid)
        self._keys = keys
        self.state = State.PRIVILEGE
        self._command(SET_SESSION_PRIVILEGE, bytes([self.settings.privilege]), now)
        return []

    def _answered(self, message: wire.Message, now: float) -> list[Event]:
        """An IPMI response to the request in flight."""
        handlers = {
            State.CAPABILITIES: self._capabilities,
            State.PRIVILEGE: self._privileged,
            State.ACTIVATING: self._activated,
            State.TAKING_OVER: self._stale_deactivated,
            State.ACTIVE: self._kept_alive,
            State.DEACTIVATING: self._deactivated,
            State.CLOSING: self._closed,
        }
        handler = handlers.get(self.state)
        if handler is None:
            raise PacketError(f"an IPMI response in state {self.state.value}")
        return handler(message, now)

    def _capabilities(self, message: wire.Message, now: float) -> list[Event]:
        data = message.data
        if message.completion or len(data) < 9 or not (data[2] & 0x80 and data[4] & 0x02):
            raise HandshakeError(
                "the BMC does not offer IPMI v2.0 (RMCP+) sessions on this channel",
                Fault.REFUSED,
            )
        self.state = State.OPENING
        self._send_payload(PayloadType.OPEN_SESSION_REQUEST, self._exchange.open_request(), now)
        return []

    def _privileged(self, message: wire.Message, now: float) -> list[Event]:
        _check(message, f"privilege level {self.settings.privilege.name.lower()}")
        self.state = State.ACTIVATING
        self._command(ACTIVATE_PAYLOAD, self._activation(), now)
        return [SessionOpened(self.settings.privilege)]

    def _activated(self, message: wire.Message, now: float) -> list[Event]:
        if message.completion == PAYLOAD_ACTIVE_ELSEWHERE:
            if not self.settings.takeover or self._taken_over:
                raise HandshakeError(COMPLETION[PAYLOAD_ACTIVE_ELSEWHERE], Fault.BUSY)
            self.state = State.TAKING_OVER
            self._command(DEACTIVATE_PAYLOAD, _payload_instance(), now)
            return []
        _check(message, "SOL activation")
        data = message.data
        if len(data) < 13:
            raise HandshakeError("the BMC's Activate Payload response is short", Fault.PROTOCOL)
        inbound = int.from_bytes(data[5:7], "little")
        outbound = int.from_bytes(data[7:9], "little")
        port = int.from_bytes(data[9:11], "little")
        s = self.settings
        self.sol = Sol(
            max_chunk=inbound - 4 if inbound > 4 else inbound,
            window=s.window,
            retry_interval=s.retry_interval,
            retries=s.retries,
        )
        self.state = State.ACTIVE
        return [PayloadActivated(inbound, outbound, port)]

    def _stale_deactivated(self, message: wire.Message, now: float) -> list[Event]:
        # 0x80 here says the payload went inactive meanwhile: as good as deactivated.
        if message.completion not in (0, PAYLOAD_ACTIVE_ELSEWHERE):
            _check(message, "deactivating the stale SOL session")
        self._taken_over = True
        self.state = State.ACTIVATING
        self._command(ACTIVATE_PAYLOAD, self._activation(), now)
        return [StaleSessionDeactivated()]

    def _kept_alive(self, message: wire.Message, now: float) -> list[Event]:
        data = message.data
        if message.completion or len(data) < 5:
            return []  # a BMC without the command still answered: it is alive
        holder = int.from_bytes(data[1:5], "little")
        if holder == self._bmc_id:
            return []
        self.state = State.CLOSING
        self._command(CLOSE_SESSION, self._bmc_id.to_bytes(4, "little"), now)
        return [PayloadDeactivated("another session deactivated SOL on the BMC")]

    def _deactivated(self, message: wire.Message, now: float) -> list[Event]:
        self._close_session(now)
        return []

    def _closed(self, message: wire.Message, now: float) -> list[Event]:
        self.state = State.CLOSED
        return [SessionClosed()]

    def _sol_received(self, payload: bytes, now: float) -> list[Event]:
        if self.state is not State.ACTIVE or self.sol is None:
            raise PacketError(f"an SOL packet in state {self.state.value}")
        sol = self.sol
        frames = sol.receive(Frame.decode(payload), now)
        self._sol_frames(frames)
        events: list[Event] = [DataReceived(data) for data in sol.delivered]
        sol.delivered.clear()
        if sol.status & Status.DEACTIVATING:
            self.state = State.CLOSING
            self._command(CLOSE_SESSION, self._bmc_id.to_bytes(4, "little"), now)
            events.append(PayloadDeactivated("the BMC deactivated SOL"))
        return events

    # sending -------------------------------------------------------------------

    def _tick(self, now: float) -> list[Event]:
        request = self._request
        if request is not None and now >= request.deadline:
            if request.sends > self.settings.retries:
                return self._timed_out(request)
            request.sends += 1
            request.deadline = now + self.settings.retry_interval
            self._outbox.append(self._wrap(request.payload_type, request.payload))
        if self.state is State.ACTIVE and self.sol is not None:
            self._sol_frames(self.sol.tick(now))
            if self._request is None and now >= self._heard + self.settings.keepalive:
                self._command(GET_PAYLOAD_INSTANCE_INFO, bytes([1, SOL_INSTANCE]), now)
                self._heard = now
        return []

    def _timed_out(self, request: _Request) -> list[Event]:
        self._request = None
        if self.state in (State.DEACTIVATING, State.CLOSING):
            # Leaving anyway: a BMC that does not answer now has dropped the session itself.
            self.state = State.CLOSED
            return [SessionClosed()]
        sends = request.sends
        if self.state is State.CAPABILITIES:
            reason = f"no BMC answered {sends} requests for its authentication capabilities"
        else:
            reason = f"the BMC stopped answering ({sends} tries in state {self.state.value})"
        return self._failed(HandshakeError(reason, Fault.TIMEOUT))

    def _failed(self, exc: HandshakeError) -> list[Event]:
        self.state = State.FAILED
        self._request = None
        return [SessionFailed(str(exc), exc.fault)]

    def _close_session(self, now: float) -> None:
        self.state = State.CLOSING
        self._command(CLOSE_SESSION, self._bmc_id.to_bytes(4, "little"), now)

    def _activation(self) -> bytes:
        keys = self._keys
        flags = 0x04  # serial alerts deferred while SOL is active
        if keys is not None and keys.encrypted:
            flags |= 0x80
        if keys is not None and keys.authenticated:
            flags |= 0x40
        return bytes([PayloadType.SOL, SOL_INSTANCE, flags, 0, 0, 0])

    def _command(self, command: int, data: bytes, now: float) -> None:
        self._rq_seq = (self._rq_seq + 1) & 0x3F
        payload = wire.request(netfn=APP, command=command, sequence=self._rq_seq, data=data)
        self._request = _Request(
            PayloadType.IPMI,
            payload,
            command,
            self._rq_seq,
            now + self.settings.retry_interval,
        )
        self._outbox.append(self._wrap(PayloadType.IPMI, payload))

    def _send_payload(self, payload_type: PayloadType, payload: bytes, now: float) -> None:
        deadline = now + self.settings.retry_interval
        self._request = _Request(payload_type, payload, -1, 0, deadline)
        self._outbox.append(self._wrap(payload_type, payload))

    def _sol_frames(self, frames: list[Frame]) -> None:
        for frame in frames:
            self._outbox.append(self._wrap(PayloadType.SOL, frame.encode()))

    def _wrap(self, payload_type: PayloadType, payload: bytes) -> bytes:
        if self.state is State.CAPABILITIES:
            return wire.build_v15(payload)
        keys = self._keys
        if keys is None:
            return wire.build(payload_type, payload)
        self._session_seq = self._session_seq % 0xFFFFFFFF + 1
        return wire.build(
            payload_type,
            payload,
            session_id=self._bmc_id,
            sequence=self._session_seq,
            keys=keys,
            iv=self._random(AES_BLOCK) if keys.encrypted else b"",
        )

    def _active_sol(self) -> Sol:
        if self.state is not State.ACTIVE or self.sol is None:
            raise UsageError(f"SOL data in state {self.state.value}")
        return self.sol


def _payload_instance() -> bytes:
    return bytes([PayloadType.SOL, SOL_INSTANCE, 0, 0, 0, 0])


def _check(message: wire.Message, what: str) -> None:
    if message.completion:
        code = message.completion
        meaning = COMPLETION.get(code, "an error")
        raise HandshakeError(f"the BMC refused {what}: {meaning} ({code:#04x})", Fault.REFUSED)
