"""A scripted BMC for codec tests: it answers a `Client`'s handshake and hands back an active one.

`ScriptedBmc.answer` builds the BMC's side of each step from the spec's
layouts (the same HMACs ipmi_sim computes, checked against a real capture
in test_ipmi.py), so tests and fuzz targets can start from a `Client` in
state ACTIVE with real keys, then send it whatever they like with
`sol_packet` and `ipmi_packet`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from subres.protocol.ipmi import client, crypto, wire
from subres.protocol.ipmi.crypto import hmac_sha1
from subres.protocol.ipmi.wire import PayloadType

__all__ = ["BMC_ID", "GUID", "ScriptedBmc", "active_client"]

BMC_ID = 0x0382
GUID = bytes.fromhex("a123456789abcdefa123456789abcdef")
USERNAME = b"admin"
PASSWORD = b"s3cret"


def _rng() -> Callable[[int], bytes]:
    counter = iter(range(1, 1 << 30))

    def rng(size: int) -> bytes:
        return bytes([next(counter) & 0xFF]) * size

    return rng


@dataclass
class ScriptedBmc:
    """The BMC's side of one handshake with a `Client`."""

    password: bytes = PASSWORD
    console_id: int = 0
    console_random: bytes = b""
    role_and_name: bytes = b""
    bmc_random: bytes = bytes(range(16))
    keys: crypto.Keys | None = None
    sequence: int = 0
    sent: list[bytes] = field(default_factory=list)

    def answer(self, datagram: bytes) -> bytes:
        """The BMC's answer to one handshake datagram of the client's."""
        packet = wire.parse(datagram, self.keys)
        if packet.v15:
            caps = bytes([0, 1, 0x80 | 0x04, 0x04, 0x02, 0, 0, 0, 0])
            return wire.build_v15(self.response(packet.payload, caps))
        if packet.payload_type is PayloadType.OPEN_SESSION_REQUEST:
            return self._opened(packet.payload)
        if packet.payload_type is PayloadType.RAKP1:
            return self._rakp2(packet.payload)
        if packet.payload_type is PayloadType.RAKP3:
            return self._rakp4()
        message = wire.parse_message(packet.payload)
        data = {
            0x3B: bytes([0, 4]),
            0x48: bytes([0, 0, 0, 0, 0, 32, 0, 255, 0, 0x6F, 0x02, 0xFF, 0xFF]),
        }.get(message.command, b"\x00")
        return self.ipmi_packet(self.response(packet.payload, data))

    def _opened(self, payload: bytes) -> bytes:
        self.console_id = int.from_bytes(payload[4:8], "little")
        body = bytes([payload[0], 0, 4, 0]) + payload[4:8] + BMC_ID.to_bytes(4, "little")
        return wire.build(PayloadType.OPEN_SESSION_RESPONSE, body + payload[8:32])

    def _rakp2(self, payload: bytes) -> bytes:
        self.console_random = payload[8:24]
        self.role_and_name = bytes([payload[24], payload[27]]) + payload[28 : 28 + payload[27]]
        code = hmac_sha1(
            self.password,
            self.console_id.to_bytes(4, "little"),
            BMC_ID.to_bytes(4, "little"),
            self.console_random,
            self.bmc_random,
            GUID,
            self.role_and_name,
        )
        head = bytes([payload[0], 0, 0, 0]) + self.console_id.to_bytes(4, "little")
        return wire.build(PayloadType.RAKP2, head + self.bmc_random + GUID + code)

    def _rakp4(self) -> bytes:
        sik = hmac_sha1(self.password, self.console_random, self.bmc_random, self.role_and_name)
        self.keys = crypto.Keys(crypto.SUITES[3], sik)
        check = hmac_sha1(sik, self.console_random, BMC_ID.to_bytes(4, "little"), GUID)[:12]
        head = bytes([0, 0, 0, 0]) + self.console_id.to_bytes(4, "little")
        return wire.build(PayloadType.RAKP4, head + check)

    def response(self, request: bytes, data: bytes) -> bytes:
        """An IPMI response to the request message `request`, carrying `data`."""
        netfn, seq, command = (request[1] >> 2) | 1, request[4], request[5]
        head = bytes([wire.CONSOLE_ADDRESS, netfn << 2])
        body = bytes([wire.BMC_ADDRESS, seq, command]) + data
        return head + bytes([wire.checksum(head)]) + body + bytes([wire.checksum(body)])

    def ipmi_packet(self, message: bytes, *, session_id: int | None = None) -> bytes:
        """An IPMI payload in the session, protected with its keys."""
        return self._packet(PayloadType.IPMI, message, session_id)

    def sol_packet(self, payload: bytes, *, session_id: int | None = None) -> bytes:
        """An SOL payload in the session, protected with its keys."""
        return self._packet(PayloadType.SOL, payload, session_id)

    def _packet(self, kind: PayloadType, payload: bytes, session_id: int | None) -> bytes:
        self.sequence += 1
        return wire.build(
            kind,
            payload,
            session_id=self.console_id if session_id is None else session_id,
            sequence=self.sequence,
            keys=self.keys,
            iv=bytes(16),
        )


def active_client(
    *, window: int = 65536, takeover: bool = False
) -> tuple[client.Client, ScriptedBmc]:
    """A `Client` through its handshake with a `ScriptedBmc`, SOL active."""
    settings = client.Settings(
        username=USERNAME,
        password=PASSWORD,
        suite=crypto.SUITES[3],
        window=window,
        takeover=takeover,
    )
    c = client.Client(settings, random=_rng())
    bmc = ScriptedBmc()
    c.start(0.0)
    for _ in range(8):
        for datagram in c.datagrams():
            c.receive(bmc.answer(datagram), 0.0)
        if c.state is client.State.ACTIVE:
            return c, bmc
    raise AssertionError(f"the handshake stopped in state {c.state.value}")
