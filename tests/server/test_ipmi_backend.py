"""IPMI Serial-over-LAN consoles through subres, against OpenIPMI's ipmi_sim as the BMC.

Standalone subres reads Machines and the Secrets they name from its objects
file; the endpoint policy allows `ipmi` on loopback. The BMC's serial port is
a TCP socket the test serves, so what a client types arrives there and what
the test writes there reaches the client; `ipmitool -I lanplus … sol
activate` reads the same serial output as the reference. ipmi_sim sometimes
drops the first packet of a new SOL session (when the last session's last
packet had the same sequence number), so each session is warmed up until a
keystroke arrives before anything is measured.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import websockets
from websockets.asyncio.client import ClientConnection, connect

from tests import support
from tests.ipmi_support import PASSWORD, STEP, USERNAME, Bmc, bmc, needs_ipmi_sim
from tests.ssh_support import secret
from tests.support import Standalone, start_standalone

pytestmark = needs_ipmi_sim

RAW = "plain.kubevirt.io"
IPMI = {"credentials": ".status.console.ipmiSecret"}
CONSOLE = {
    "endpoint": ".status.console.endpoint",
    "require": {".status.phase": ["Running"]},
    "ipmi": IPMI,
    "consoles": {
        # Never kept: kept too, it would take SOL from the default console's keeper.
        "takeover": {
            "endpoint": ".status.console.endpoint",
            "ipmi": IPMI | {"takeover": True},
            "keep": "never",
        }
    },
}


def config(tmp: Path) -> dict[str, Any]:
    return {
        "endpointPolicy": {
            "schemes": ["tcp", "unix", "ipmi"],
            "allowCIDRs": ["127.0.0.0/8"],
            "denyCIDRs": [],
            "socketDirs": [str(tmp)],
        },
        "parents": [
            {
                "resource": "machines",
                "kind": "Machine",
                "source": {"group": "subres.dev", "version": "v1alpha1"},
                "subresources": {"console": CONSOLE},
            }
        ],
    }


def machine(
    name: str, endpoint: str, secret_name: str = "bmc", *, kept: bool = False
) -> dict[str, Any]:
    status = {"console": {"endpoint": endpoint, "ipmiSecret": secret_name}}
    annotations = {"subres.dev/keep-console": "true"} if kept else None
    return support.machine(name, status=status, annotations=annotations)


@dataclass
class Setup:
    subres: Standalone
    bmc: Bmc


@pytest.fixture
async def setup(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Setup]:
    async with bmc(tmp_path) as sim:
        closed = f"ipmi://127.0.0.1:{support.free_port(socket.SOCK_DGRAM)}"  # nothing listens
        objects = [
            secret("bmc", {"username": USERNAME, "password": PASSWORD}),
            secret("wrong", {"username": USERNAME, "password": "not-the-password"}),
            secret("stranger", {"username": "nobody", "password": PASSWORD}),
            machine("host", sim.url),
            machine("wrong", sim.url, "wrong"),
            machine("stranger", sim.url, "stranger"),
            machine("nosecret", sim.url, "missing"),
            machine("suite17", sim.url + "?cipherSuite=17"),
            machine("suite0", sim.url + "?cipherSuite=0"),
            machine("suite2", sim.url + "?cipherSuite=2&privilege=operator"),
            machine("closed", closed),
            machine("far", "ipmi://10.1.2.3"),
        ]
        if request.node.name.startswith("test_a_kept_console"):
            objects.append(machine("kept", sim.url, kept=True))
        session = {"connectTimeout": 3, "pingInterval": 1}
        async with start_standalone(
            tmp_path, *objects, config=config(tmp_path), session=session
        ) as subres:
            yield Setup(subres, sim)


def console(setup: Setup, name: str, which: str = "") -> connect:
    url = setup.subres.url(name) + (f"?console={which}" if which else "")
    return setup.subres.websocket(url, RAW)


async def warm_up(conn: ClientConnection, setup: Setup) -> None:
    """Type until a keystroke reaches the serial port (see the module docstring)."""
    serial = setup.bmc.serial
    for _ in range(5):
        await conn.send(b"w")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(2):
                await serial.until_match(b"w")
            serial.received.clear()
            return
    raise AssertionError("no keystroke reached the BMC's serial port")


async def received(conn: ClientConnection, size: int) -> bytes:
    got = bytearray()
    async with asyncio.timeout(STEP):
        while len(got) < size:
            message = await conn.recv()
            assert isinstance(message, bytes)
            got += message
    return bytes(got)


async def test_bytes_both_ways_arrive_whole(setup: Setup) -> None:
    down, up = os.urandom(48 << 10), os.urandom(12 << 10)
    async with console(setup, "host") as conn:
        await warm_up(conn, setup)
        await setup.bmc.serial.write(down)
        got = await received(conn, len(down))
        assert hashlib.sha256(got).hexdigest() == hashlib.sha256(down).hexdigest()
        for offset in range(0, len(up), 1024):
            await conn.send(up[offset : offset + 1024])
        arrived = await setup.bmc.serial.until(len(up))
        assert hashlib.sha256(arrived).hexdigest() == hashlib.sha256(up).hexdigest()


async def test_cipher_suite_2_at_operator_privilege(setup: Setup) -> None:
    async with console(setup, "suite2") as conn:
        await warm_up(conn, setup)
        await setup.bmc.serial.write(b"login: ")
        assert await received(conn, 7) == b"login: "


@contextlib.asynccontextmanager
async def ipmitool_sol(sim: Bmc) -> AsyncIterator[asyncio.subprocess.Process]:
    """`ipmitool -I lanplus … sol activate` holding SOL; stopped by PID.

    Its output is a pipe, which stdio would buffer: stdbuf has it written as it comes.
    """
    process = await asyncio.create_subprocess_exec(
        "stdbuf", "-o0", "ipmitool", "-I", "lanplus", "-H", "127.0.0.1", "-p", str(sim.port),
        "-U", USERNAME, "-P", PASSWORD, "-C", "3", "sol", "activate",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        yield process
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                async with asyncio.timeout(STEP):
                    await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()


async def read_until(process: asyncio.subprocess.Process, marker: bytes) -> bytes:
    assert process.stdout is not None
    seen = b""
    async with asyncio.timeout(STEP):
        while marker not in seen:
            chunk = await process.stdout.read(65536)
            assert chunk, seen
            seen += chunk
    return seen


async def test_subres_reads_what_ipmitool_reads(setup: Setup) -> None:
    """The same serial output, byte for byte, through ipmitool and through subres."""
    output = bytes(range(32, 127)) * 40 + b"\r\n"
    async with ipmitool_sol(setup.bmc) as tool:
        await read_until(tool, b"SOL Session operational")
        await setup.bmc.serial.write(output + b"END-OF-OUTPUT")
        seen = await read_until(tool, b"END-OF-OUTPUT")
        reference = seen[seen.index(output[:40]) :].removesuffix(b"END-OF-OUTPUT")
        assert tool.stdin is not None
        tool.stdin.write(b"~.")
    async with console(setup, "host", "takeover") as conn:
        await warm_up(conn, setup)
        await setup.bmc.serial.write(output)
        assert await received(conn, len(output)) == reference == output


async def test_sol_held_elsewhere_is_409_unless_taken_over(setup: Setup) -> None:
    async with ipmitool_sol(setup.bmc) as tool:
        await read_until(tool, b"SOL Session operational")
        code, status = await setup.subres.refused(setup.subres.url("host"), RAW)
        assert code == 409 and "SOL payload already active on another session" in str(
            status["message"]
        )
        async with console(setup, "host", "takeover") as conn:
            await warm_up(conn, setup)
            await setup.bmc.serial.write(b"taken over\r\n")
            assert await received(conn, 12) == b"taken over\r\n"
    await support.wait_for(lambda: len(setup.subres.audit_lines()) >= 1)
    started = [line for line in setup.subres.audit_lines() if line.get("stage") == "start"]
    assert any("deactivated" in str(line.get("backend", "")) for line in started), started
    assert PASSWORD not in json.dumps(setup.subres.audit_lines())


async def test_a_restarted_bmc_ends_the_session_with_1011_and_a_reason(setup: Setup) -> None:
    async with console(setup, "host") as conn:
        await warm_up(conn, setup)
        await setup.bmc.restart()
        with pytest.raises(websockets.ConnectionClosed):
            async with asyncio.timeout(STEP):
                while True:
                    await conn.send(b"x")
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(0.5):
                            await conn.recv()
        assert conn.close_code == 1011
        assert conn.close_reason is not None and "BMC" in conn.close_reason, conn.close_reason
    async with console(setup, "host") as conn:  # the new BMC serves a new session
        await warm_up(conn, setup)


@pytest.mark.parametrize(
    ("name", "code", "words"),
    [
        ("wrong", 502, "does not prove the password: wrong password"),
        ("stranger", 502, "unauthorized name"),
        ("nosecret", 400, "Secret 'missing' with the IPMI credentials does not exist"),
        ("suite17", 400, "cipher suite '17' is not spoken here"),
        ("suite0", 400, "cipher suite 0 (no authentication or encryption) is not allowed"),
        ("closed", 503, "unreachable"),
        ("far", 403, "not allowed by the endpoint policy"),
    ],
)
async def test_refusals_are_quick_statuses(setup: Setup, name: str, code: int, words: str) -> None:
    started = time.monotonic()
    got, status = await setup.subres.refused(setup.subres.url(name), RAW)
    message = str(status["message"])
    assert got == code and words in message, (got, message)
    assert time.monotonic() - started < 2.5
    assert PASSWORD not in message and "not-the-password" not in message


async def test_sol_deactivated_by_another_session_ends_ours(setup: Setup) -> None:
    async with console(setup, "host") as conn:
        await warm_up(conn, setup)
        tool = await asyncio.create_subprocess_exec(
            "ipmitool", "-I", "lanplus", "-H", "127.0.0.1", "-p", str(setup.bmc.port),
            "-U", USERNAME, "-P", PASSWORD, "-C", "3", "sol", "deactivate",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        async with asyncio.timeout(STEP):
            assert await tool.wait() == 0
        with pytest.raises(websockets.ConnectionClosed):
            async with asyncio.timeout(STEP):
                while True:
                    await conn.recv()
        assert conn.close_code == 1011
        assert conn.close_reason is not None and "another session" in conn.close_reason


async def test_a_kept_console_redials_a_restarted_bmc(setup: Setup) -> None:
    hubs = setup.subres.server.state.sessions.hubs

    def kept() -> bool:
        return any(hub.source is not None for hub in hubs.values())

    await support.wait_for(kept)
    async with console(setup, "kept") as conn:
        await warm_up(conn, setup)
        await setup.bmc.restart()
        with pytest.raises(websockets.ConnectionClosed):
            async with asyncio.timeout(STEP):
                while True:
                    await conn.recv()
        assert conn.close_reason is not None and "BMC" in conn.close_reason
    await support.wait_for(kept)  # the keeper logged in to the new BMC
    async with console(setup, "kept") as conn:
        await warm_up(conn, setup)
        await setup.bmc.serial.write(b"after restart\r\n")
        assert await received(conn, 15) == b"after restart\r\n"
