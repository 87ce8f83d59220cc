"""The IPMI backend's driver on its own: settings from the configuration and the endpoint,
credentials kept out of sight, and, against ipmi_sim, breaks and a reader too slow for the BMC.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from subres.backends import endpoint, ipmi
from subres.config import IpmiSpec
from subres.protocol.ipmi import client
from tests.ipmi_support import PASSWORD, STEP, USERNAME, Bmc, bmc, needs_ipmi_sim

SPEC = IpmiSpec(credentials=".status.secret")
CREDS = ipmi.Credentials(USERNAME, PASSWORD.encode())
TIMING = ipmi.Timing(connect_timeout=3)


def test_the_endpoint_chooses_suite_and_privilege() -> None:
    options = endpoint.parse("ipmi://bmc.example?cipherSuite=2&privilege=operator").options
    got = ipmi.settings(SPEC, options, CREDS, TIMING)
    assert (got.suite.number, got.privilege) == (2, client.Privilege.OPERATOR)
    assert ipmi.settings(SPEC, (), CREDS, TIMING).suite.number == 3


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ((("cipherSuite", "0"),), "cipher suite 0"),
        ((("cipherSuite", "17"),), "'17' is not spoken here"),
        ((("cipherSuite", "x"),), "'x' is not spoken here"),
        ((("privilege", "root"),), "privilege 'root'"),
    ],
)
def test_unusable_choices_are_400(options: tuple[tuple[str, str], ...], words: str) -> None:
    with pytest.raises(ipmi.IpmiError) as caught:
        ipmi.settings(SPEC, options, CREDS, TIMING)
    assert caught.value.code == 400 and words in str(caught.value)


def test_suite_zero_only_when_the_configuration_allows_it() -> None:
    spec = IpmiSpec(credentials=".s", allow_cipher_suite_zero=True)
    assert ipmi.settings(spec, (("cipherSuite", "0"),), CREDS, TIMING).suite.number == 0


def test_passwords_stay_out_of_reprs() -> None:
    settings = ipmi.settings(SPEC, (), CREDS, TIMING)
    for thing in (CREDS, settings, client.Client(settings)._exchange):
        assert PASSWORD not in repr(thing)


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (None, "does not exist"),
        ({"username": b"admin"}, "needs both"),
        ({"username": b"admin", "password": b"x" * 21}, "passwords of 20"),
    ],
)
def test_secrets_that_will_not_do(data: dict[str, bytes] | None, words: str) -> None:
    with pytest.raises(ipmi.IpmiError) as caught:
        ipmi.credentials(data, name="bmc")
    assert caught.value.code == 400 and words in str(caught.value)


@pytest.fixture
async def sim(tmp_path: Path) -> AsyncIterator[Bmc]:
    async with bmc(tmp_path) as running:
        yield running


async def _open(sim: Bmc, timing: ipmi.Timing = TIMING) -> ipmi.IpmiConsole:
    target = endpoint.Target(endpoint.parse(sim.url), "127.0.0.1")
    console = await ipmi.open_console(target, CREDS, SPEC, timing=timing)
    for _ in range(5):  # ipmi_sim may drop a new session's first packet
        await console.write(b"w")
        try:
            async with asyncio.timeout(2):
                await sim.serial.until_match(b"w")
            sim.serial.received.clear()
            return console
        except TimeoutError:
            continue
    raise AssertionError("no keystroke reached the serial port")


@needs_ipmi_sim
async def test_a_break_reaches_the_serial_line(sim: Bmc) -> None:
    console = await _open(sim)
    try:
        console.send_break()
        await console.write(b"after")
        # ipmi_sim's TCP serial line writes a break as telnet's IAC BREAK.
        await sim.serial.until_match(b"\xff\xf3after")
    finally:
        await console.close()


@needs_ipmi_sim
async def test_a_slow_reader_loses_nothing(sim: Bmc, caplog: pytest.LogCaptureFixture) -> None:
    """The BMC is NACKed instead of left to give up: ipmi_sim drops a packet after 5 s unacked."""
    caplog.set_level(logging.DEBUG)
    console = await _open(sim, ipmi.Timing(connect_timeout=3, window=512))
    try:
        data = os.urandom(16 << 10)
        await sim.serial.write(data)
        # The reader is slow on purpose, longer than ipmi_sim resends an unacknowledged packet.
        await asyncio.sleep(7)
        got = bytearray()
        async with asyncio.timeout(STEP):
            while len(got) < len(data):
                got += await console.read()
        assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest()
    finally:
        await console.close()
    assert PASSWORD not in caplog.text


@needs_ipmi_sim
async def test_a_write_waits_while_the_bmc_is_behind(sim: Bmc) -> None:
    console = await _open(sim, ipmi.Timing(connect_timeout=3, high_water=64))
    try:
        data = os.urandom(4096)
        async with asyncio.timeout(STEP):
            await console.write(data)
        sol = console._codec.sol
        assert sol is not None and sol.unsent <= 64
        assert hashlib.sha256(await sim.serial.until(len(data))).digest() == (
            hashlib.sha256(data).digest()
        )
    finally:
        await console.close()
