"""The IPMI codec against ipmitool's bytes, round trips, SOL flow rules and hostile input."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from subres.protocol.ipmi import client, crypto, rakp, sol, wire
from subres.protocol.ipmi.errors import Fault, HandshakeError, IntegrityError, PacketError
from subres.protocol.ipmi.events import (
    DataReceived,
    Event,
    PayloadDeactivated,
    SessionClosed,
    SessionFailed,
)
from tests.protocol.ipmi_bmc import ScriptedBmc, active_client
from tests.protocol.ipmi_capture import CAPTURE, PASSWORD, USERNAME

SUITE3 = crypto.SUITES[3]


def _payload(index: int) -> bytes:
    return wire.parse(CAPTURE[index][1]).payload


def _ipmitool_exchange(password: bytes = PASSWORD) -> rakp.Exchange:
    """The handshake ipmitool ran, with its session ID and random number from the capture."""
    rakp1 = _payload(4)
    return rakp.Exchange(
        username=USERNAME,
        password=password,
        suite=SUITE3,
        privilege=client.Privilege.ADMINISTRATOR,
        console_id=int.from_bytes(_payload(2)[4:8], "little"),
        console_random=rakp1[8:24],
    )


def _ipmitool_keys() -> tuple[crypto.Keys, int]:
    exchange = _ipmitool_exchange()
    bmc_id = exchange.opened(_payload(3))
    bmc_random, guid = exchange.rakp2(_payload(5), bmc_id)
    keys = exchange.keys(bmc_random)
    exchange.rakp4(_payload(7), keys=keys, bmc_id=bmc_id, guid=guid)
    return keys, bmc_id


def test_get_channel_auth_capabilities_is_ipmitools_datagram() -> None:
    message = wire.request(netfn=0x06, command=0x38, sequence=0, data=bytes([0x8E, 0x04]))
    assert wire.build_v15(message) == CAPTURE[0][1]
    answer = wire.parse_message(wire.parse(CAPTURE[1][1]).payload)
    assert (answer.netfn, answer.command, answer.completion) == (0x07, 0x38, 0)


def test_open_session_and_rakp1_are_ipmitools_bytes() -> None:
    exchange = _ipmitool_exchange()
    assert (
        wire.build(wire.PayloadType.OPEN_SESSION_REQUEST, exchange.open_request())
        == (CAPTURE[2][1])
    )
    bmc_id = exchange.opened(_payload(3))
    assert bmc_id == 0x382
    assert wire.build(wire.PayloadType.RAKP1, exchange.rakp1(bmc_id)) == CAPTURE[4][1]


def test_rakp_proofs_match_ipmitool_and_the_bmc() -> None:
    exchange = _ipmitool_exchange()
    bmc_id = exchange.opened(_payload(3))
    bmc_random, guid = exchange.rakp2(_payload(5), bmc_id)
    assert guid == bytes.fromhex("a123456789abcdefa123456789abcdef")
    assert exchange.rakp3(bmc_id, bmc_random) == _payload(6)
    exchange.rakp4(_payload(7), keys=exchange.keys(bmc_random), bmc_id=bmc_id, guid=guid)


def test_a_wrong_password_is_found_in_rakp2() -> None:
    exchange = _ipmitool_exchange(password=b"wrong")
    bmc_id = exchange.opened(_payload(3))
    with pytest.raises(HandshakeError) as caught:
        exchange.rakp2(_payload(5), bmc_id)
    assert caught.value.fault is Fault.CREDENTIALS
    assert "wrong" in str(caught.value) and b"s3cret".decode() not in str(caught.value)


def test_session_packets_verify_decrypt_and_rebuild_byte_for_byte() -> None:
    keys, bmc_id = _ipmitool_keys()
    first = wire.parse_message(wire.parse(CAPTURE[8][1], keys).payload)
    assert (first.netfn, first.command, first.data) == (0x06, 0x3B, b"\x04")
    for direction, datagram in CAPTURE[8:]:
        packet = wire.parse(datagram, keys)
        assert packet.authenticated and packet.encrypted
        wire.parse_message(packet.payload)
        if direction == "C":
            assert packet.session_id == bmc_id
            iv = datagram[16:32]
            rebuilt = wire.build(
                packet.payload_type,
                packet.payload,
                session_id=packet.session_id,
                sequence=packet.sequence,
                keys=keys,
                iv=iv,
            )
            assert rebuilt == datagram


def test_a_changed_byte_fails_the_integrity_check() -> None:
    keys, _ = _ipmitool_keys()
    datagram = bytearray(CAPTURE[9][1])
    datagram[20] ^= 1
    with pytest.raises(IntegrityError):
        wire.parse(bytes(datagram), keys)


def test_an_unknown_user_is_a_credentials_fault() -> None:
    exchange = _ipmitool_exchange()
    refusal = bytes([0, 0x0D, 0, 0]) + exchange.console_id.to_bytes(4, "little")
    with pytest.raises(HandshakeError) as caught:
        exchange.rakp2(refusal, 0x382)
    assert caught.value.fault is Fault.CREDENTIALS and "unauthorized name" in str(caught.value)


def test_a_refused_cipher_suite_names_the_status() -> None:
    exchange = _ipmitool_exchange()
    refusal = bytes([0, 0x11, 0, 0]) + exchange.console_id.to_bytes(4, "little")
    with pytest.raises(HandshakeError) as caught:
        exchange.opened(refusal)
    assert caught.value.fault is Fault.REFUSED and "no cipher suite match" in str(caught.value)


keys_st = st.builds(
    crypto.Keys, st.sampled_from(list(crypto.SUITES.values())), st.binary(min_size=20, max_size=20)
)


@given(
    keys=keys_st,
    payload=st.binary(max_size=300),
    sid=st.integers(0, 2**32 - 1),
    seq=st.integers(0, 2**32 - 1),
    iv=st.binary(min_size=16, max_size=16),
)
def test_session_packets_round_trip(
    keys: crypto.Keys, payload: bytes, sid: int, seq: int, iv: bytes
) -> None:
    datagram = wire.build(
        wire.PayloadType.SOL, payload, session_id=sid, sequence=seq, keys=keys, iv=iv
    )
    packet = wire.parse(datagram, keys)
    assert (packet.payload, packet.session_id, packet.sequence) == (payload, sid, seq)
    assert packet.authenticated == keys.authenticated and packet.encrypted == keys.encrypted


@given(keys=keys_st, payload=st.binary(max_size=64), where=st.data())
def test_any_corruption_is_a_packet_error(
    keys: crypto.Keys, payload: bytes, where: st.DataObject
) -> None:
    datagram = bytearray(
        wire.build(
            wire.PayloadType.IPMI, payload, session_id=7, sequence=9, keys=keys, iv=bytes(16)
        )
    )
    index = where.draw(st.integers(4, len(datagram) - 1))
    datagram[index] ^= where.draw(st.integers(1, 255))
    try:
        packet = wire.parse(bytes(datagram), keys)
    except PacketError:
        return
    # Without integrity nothing can notice a changed byte; it must still parse as something.
    assert not keys.authenticated or packet.payload != payload


@given(st.binary(max_size=2000))
def test_hostile_datagrams_raise_only_packet_errors(data: bytes) -> None:
    keys = crypto.Keys(SUITE3, bytes(20))
    for candidate in (data, wire.RMCP_IPMI + data, wire.RMCP_IPMI + b"\x06" + data):
        try:
            packet = wire.parse(candidate, keys)
            wire.parse_message(packet.payload)
        except PacketError:
            pass


@given(
    seq=st.integers(0, 15),
    ack=st.integers(0, 15),
    count=st.integers(0, 255),
    flags=st.integers(0, 255),
    data=st.binary(max_size=255),
)
def test_sol_frames_round_trip(seq: int, ack: int, count: int, flags: int, data: bytes) -> None:
    frame = sol.Frame(seq, ack, count, flags, data)
    assert sol.Frame.decode(frame.encode()) == frame


def test_sol_payloads_too_short_or_long_are_refused() -> None:
    with pytest.raises(PacketError):
        sol.Frame.decode(b"\x01\x00\x00")
    with pytest.raises(PacketError):
        sol.Frame.decode(bytes(4 + 256))


def _sol(window: int = 100) -> sol.Sol:
    return sol.Sol(max_chunk=8, window=window, retry_interval=1.0, retries=2)


def test_sol_sends_the_rest_of_a_partial_ack_under_the_next_number() -> None:
    s = _sol()
    (first,) = s.send(b"0123456789", 0.0)
    assert (first.sequence, first.data) == (1, b"01234567")
    (second,) = s.receive(sol.Frame(ack=1, accepted=3), 0.1)
    assert (second.sequence, second.data) == (2, b"34567" + b"89"[:3])
    assert s.unsent == 7


def test_sol_resends_the_same_packet_then_gives_up() -> None:
    s = _sol()
    (first,) = s.send(b"x", 0.0)
    assert s.tick(0.5) == []
    assert s.tick(1.0) == [first]
    assert s.tick(2.0) == [first]
    with pytest.raises(HandshakeError) as caught:
        s.tick(3.0)
    assert caught.value.fault is Fault.TIMEOUT


def test_sol_acks_a_repeated_bmc_packet_without_delivering_it_twice() -> None:
    s = _sol()
    assert s.receive(sol.Frame(5, data=b"abc"), 0.0) == [sol.Frame(ack=5, accepted=3)]
    assert s.receive(sol.Frame(5, data=b"abc"), 0.1) == [sol.Frame(ack=5, accepted=3)]
    assert list(s.delivered) == [b"abc"]


def test_sol_acks_only_what_fits_and_nacks_when_full_until_consumed() -> None:
    s = _sol(window=4)
    assert s.receive(sol.Frame(1, data=b"abcdef"), 0.0) == [sol.Frame(ack=1, accepted=4)]
    nack = s.receive(sol.Frame(2, data=b"ef"), 0.1)
    assert nack == [sol.Frame(ack=2, flags=sol.Control.NACK)]
    assert s.consumed(4) == [sol.Frame(ack=3)]
    assert b"".join(s.delivered) == b"abcd"


def test_sol_holds_data_the_bmc_nacked_for_a_retry_interval() -> None:
    s = _sol()
    s.send(b"abcd", 0.0)
    assert s.receive(sol.Frame(ack=1, accepted=1, flags=sol.Status.NACK), 0.1) == []
    assert s.deadline() == pytest.approx(1.1)
    (again,) = s.tick(1.1)
    assert (again.sequence, again.data) == (2, b"bcd")


def test_a_lone_break_travels_unsequenced() -> None:
    (frame,) = _sol().send_break(0.0)
    assert frame.sequence == 0 and frame.flags & sol.Control.BREAK


def _client(**overrides: object) -> client.Client:
    counter = iter(range(1, 10**6))

    def rng(size: int) -> bytes:
        return bytes([next(counter) & 0xFF]) * size

    settings = client.Settings(username=USERNAME, password=PASSWORD, suite=SUITE3)
    return client.Client(settings, random=rng)


def test_a_silent_bmc_fails_the_session_within_its_retries() -> None:
    c = _client()
    c.start(0.0)
    assert len(c.datagrams()) == 1
    events: list[Event] = []
    now = 0.0
    while not events:
        deadline = c.deadline()
        assert deadline is not None and deadline < 10
        now = deadline
        events = c.tick(now)
    (failed,) = events
    assert isinstance(failed, SessionFailed) and failed.fault is Fault.TIMEOUT
    assert now == pytest.approx(4.0)
    assert len(c.datagrams()) == 3


@given(st.lists(st.binary(max_size=200), max_size=20))
def test_the_client_ignores_garbage_in_any_handshake_state(datagrams: list[bytes]) -> None:
    c = _client()
    c.start(0.0)
    for data in datagrams:
        assert c.receive(data, 0.1) == []
        assert c.receive(wire.RMCP_IPMI + data, 0.1) == []
    assert c.state is client.State.CAPABILITIES


def test_an_active_session_delivers_sol_and_acks_it() -> None:
    c, bmc = active_client()
    events = c.receive(bmc.sol_packet(bytes([1, 0, 0, 0]) + b"login: "), 1.0)
    assert events == [DataReceived(b"login: ")]
    (ack,) = c.datagrams()
    frame = sol.Frame.decode(wire.parse(ack, bmc.keys).payload)
    assert (frame.sequence, frame.ack, frame.accepted) == (0, 1, 7)


@pytest.mark.parametrize(
    "forged",
    [
        "another session",
        "flipped byte",
        "unprotected",
        "short sol",
        "huge sol",
    ],
)
def test_an_active_session_ignores_what_it_cannot_trust(forged: str) -> None:
    c, bmc = active_client()
    good = bytes([1, 0, 0, 0]) + b"x"
    datagram = {
        "another session": lambda: bmc.sol_packet(good, session_id=bmc.console_id ^ 1),
        "flipped byte": lambda: bmc.sol_packet(good)[:-1] + b"\x00",
        "unprotected": lambda: wire.build(
            wire.PayloadType.SOL, good, session_id=bmc.console_id, sequence=99
        ),
        "short sol": lambda: bmc.sol_packet(b"\x01\x00"),
        "huge sol": lambda: bmc.sol_packet(bytes([1, 0, 0, 0]) + bytes(300)),
    }[forged]()
    assert c.receive(datagram, 1.0) == []
    assert c.ignored == 1 and c.state is client.State.ACTIVE and c.datagrams() == []


def test_out_of_order_acks_and_stray_responses_change_nothing() -> None:
    c, bmc = active_client()
    c.send(b"abc", 1.0)
    c.datagrams()
    assert c.receive(bmc.sol_packet(bytes([0, 9, 3, 0])), 1.1) == []  # an ACK of no packet
    stray = bmc.response(wire.request(netfn=6, command=0x01, sequence=33), b"\x00")
    assert c.receive(bmc.ipmi_packet(stray), 1.2) == []
    assert c.sol is not None and c.sol.unsent == 3 and c.ignored == 1


def test_the_bmc_deactivating_sol_ends_the_session() -> None:
    c, bmc = active_client()
    (event,) = c.receive(bmc.sol_packet(bytes([0, 0, 0, sol.Status.DEACTIVATING])), 1.0)
    assert isinstance(event, PayloadDeactivated)
    assert c.state is client.State.CLOSING


def test_a_keepalive_finds_sol_taken_by_another_session() -> None:
    c, bmc = active_client()
    assert c.deadline() == pytest.approx(10.0)
    assert c.tick(10.0) == []
    (keepalive,) = c.datagrams()
    request = wire.parse(keepalive, bmc.keys).payload
    holder = (0x999).to_bytes(4, "little") + bytes(8)
    answer = bmc.ipmi_packet(bmc.response(request, b"\x00" + holder))
    (event,) = c.receive(answer, 10.1)
    assert isinstance(event, PayloadDeactivated) and "another session" in event.reason


def test_sol_busy_is_a_busy_fault_without_takeover() -> None:
    settings = client.Settings(username=USERNAME, password=PASSWORD, suite=SUITE3)
    c = client.Client(settings)
    bmc = ScriptedBmc()
    c.start(0.0)
    events: list[SessionFailed] = []
    while not events:
        (datagram,) = c.datagrams()
        packet = wire.parse(datagram, bmc.keys)
        answer = bmc.answer(datagram)
        activating = not packet.v15 and packet.payload_type is wire.PayloadType.IPMI
        if activating and wire.parse_message(packet.payload).command == 0x48:
            answer = bmc.ipmi_packet(bmc.response(packet.payload, b"\x80"))
        events = [e for e in c.receive(answer, 0.0) if isinstance(e, SessionFailed)]
    assert events[0].fault is Fault.BUSY
    assert "already active on another session" in events[0].reason


def test_a_replayed_packet_is_dropped() -> None:
    c, bmc = active_client()
    datagram = bmc.sol_packet(bytes([1, 0, 0, 0]) + b"x")
    assert c.receive(datagram, 1.0) == [DataReceived(b"x")]
    assert c.receive(datagram, 1.1) == []
    assert c.ignored == 1


def test_character_transfer_unavailable_holds_our_characters() -> None:
    s = _sol()
    assert s.receive(sol.Frame(flags=sol.Status.UNAVAILABLE), 0.0) == []
    assert s.send(b"abc", 0.5) == []
    assert s.deadline() == pytest.approx(1.0)
    (frame,) = s.tick(1.0)
    assert frame.data == b"abc"


def test_close_deactivates_sol_then_closes_the_session() -> None:
    c, bmc = active_client()
    assert c.close(1.0) == []
    commands = []
    events: list[Event] = []
    for _ in range(2):
        (datagram,) = c.datagrams()
        commands.append(wire.parse_message(wire.parse(datagram, bmc.keys).payload).command)
        events += c.receive(bmc.answer(datagram), 1.1)
    assert commands == [0x49, 0x3C]
    assert events == [SessionClosed()] and c.state is client.State.CLOSED
    assert c.close(1.2) == []


def test_packet_layout_as_the_spec_draws_it() -> None:
    """Section 13.6: RMCP header, auth type 6, payload type with encrypted and authenticated
    bits, session ID and sequence little-endian, the payload length, then the integrity pad
    (0xFF) to a multiple of 4, its length, next header 0x07 and a 12-byte AuthCode."""
    keys = crypto.Keys(crypto.SUITES[2], bytes(20))
    datagram = wire.build(
        wire.PayloadType.SOL, b"\x01\x00\x00\x00abc", session_id=0x11223344, sequence=5, keys=keys
    )
    assert datagram[:4] == bytes.fromhex("0600ff07")
    assert datagram[4:16] == bytes.fromhex("06 41 44332211 05000000 0700")
    trailer = datagram[23:-12]
    assert trailer == bytes.fromhex("ff ff ff 03 07")
    assert len(datagram[4:-12]) % 4 == 0
    assert sol.Frame(1, 2, 3, sol.Control.BREAK, b"x").encode() == bytes.fromhex("01 02 03 10 78")
