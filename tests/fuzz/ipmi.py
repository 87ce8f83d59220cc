"""Fuzz targets of the IPMI codec: what a hostile network can send a remote console.

Same rules as `targets.py`: only the documented errors may escape (none at
all from `Client`, which drops what it cannot use), and each target checks
what a user relies on: round trips, characters delivered at most once and
never more than acknowledged, and bounded output.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import atheris

from subres.protocol.ipmi import client, crypto, sol, wire
from subres.protocol.ipmi.errors import PacketError
from subres.protocol.ipmi.events import DataReceived
from tests.protocol.ipmi_bmc import ScriptedBmc, active_client

__all__ = ["TARGETS"]

_KEYS = [crypto.Keys(suite, bytes(range(20))) for suite in crypto.SUITES.values()]


def packets(data: bytes) -> None:
    """One datagram, parsed with each suite's keys; a built packet parses back."""
    fdp = atheris.FuzzedDataProvider(data)
    keys = _KEYS[fdp.ConsumeIntInRange(0, len(_KEYS) - 1)]
    payload = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 300))
    built = wire.build(
        wire.PayloadType.SOL, payload, session_id=5, sequence=6, keys=keys, iv=bytes(16)
    )
    assert wire.parse(built, keys).payload == payload
    raw = fdp.ConsumeBytes(fdp.remaining_bytes())
    for candidate in (raw, wire.RMCP_IPMI + raw, built[: len(raw) % (len(built) + 1)] + raw):
        for with_keys in (None, keys):
            try:
                packet = wire.parse(candidate, with_keys)
                wire.parse_message(packet.payload)
            except PacketError:
                pass
            with contextlib.suppress(PacketError):
                sol.Frame.decode(candidate)


def handshake(data: bytes) -> None:
    """A BMC whose answers the fuzzer mutates, replaces or replays during the handshake."""
    fdp = atheris.FuzzedDataProvider(data)
    settings = client.Settings(username=b"admin", password=b"s3cret", suite=crypto.SUITES[3])
    c = client.Client(settings, random=bytes)
    bmc = ScriptedBmc()
    c.start(0.0)
    now = 0.0
    answers: list[bytes] = []
    for _ in range(fdp.ConsumeIntInRange(0, 12)):
        out = c.datagrams()
        assert len(out) <= 4
        for datagram in out:
            # The scripted BMC is no parser of hostile input: a step it cannot answer is skipped.
            with contextlib.suppress(PacketError, IndexError, ValueError):
                answers.append(bmc.answer(datagram))
        choice = fdp.ConsumeIntInRange(0, 3)
        if choice == 0 and answers:
            c.receive(answers[-1], now)
        elif choice == 1 and answers:
            answer = bytearray(answers[fdp.ConsumeIntInRange(0, len(answers) - 1)])
            answer[fdp.ConsumeIntInRange(0, len(answer) - 1)] ^= fdp.ConsumeIntInRange(1, 255)
            c.receive(bytes(answer), now)
        elif choice == 2:
            c.receive(fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 200)), now)
        else:
            now += fdp.ConsumeFloatInRange(0.0, 2.0)
            c.tick(now)


def sol_session(data: bytes) -> None:
    """An active session: SOL packets of the fuzzer's making, keystrokes, reads and time.

    Characters waiting for the reader never exceed the window, whatever the BMC sends.
    """
    fdp = atheris.FuzzedDataProvider(data)
    window = fdp.ConsumeIntInRange(1, 600)
    c, bmc = active_client(window=window)
    now, waiting = 1.0, 0
    for _ in range(fdp.ConsumeIntInRange(0, 40)):
        if c.state is not client.State.ACTIVE:
            break
        choice = fdp.ConsumeIntInRange(0, 4)
        if choice == 0:
            head = bytes(fdp.ConsumeIntInRange(0, 255) for _ in range(4))
            body = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 260))
            events = c.receive(bmc.sol_packet(head + body), now)
            waiting += sum(len(e.data) for e in events if isinstance(e, DataReceived))
        elif choice == 1:
            c.send(fdp.ConsumeBytes(fdp.ConsumeIntInRange(1, 300)), now)
        elif choice == 2:
            taken = fdp.ConsumeIntInRange(0, waiting)
            c.consumed(taken)
            waiting -= taken
        elif choice == 3:
            c.send_break(now)
        else:
            now += fdp.ConsumeFloatInRange(0.0, 3.0)
            c.tick(now)
        assert waiting <= window
        assert len(c.datagrams()) <= 4


TARGETS: dict[str, Callable[[bytes], None]] = {
    "ipmi-packets": packets,
    "ipmi-handshake": handshake,
    "ipmi-sol": sol_session,
}
"""The IPMI codec's targets by name."""
