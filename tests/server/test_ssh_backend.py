"""SSH backends through subres: consoles on OpenSSH sshd and port-forwards through it.

Standalone subres reads Machines and the Secrets they name from its objects
file; the endpoint policy allows `ssh`. A console is a PTY on sshd reached
over a `v5.channel.k8s.io` WebSocket (resize channel included) or a raw one;
its exit status arrives on the error channel as kubelet reports an exec's;
a dying sshd ends the session with 1011 and a reason. Port-forwards go
through sshd as a jump host (direct-tcpip), the policy vetting both the SSH
host and the target. Every refusal is a Status with its code, and a refused
request makes no SSH connection.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import websockets
from websockets.asyncio.client import ClientConnection, connect

from tests import support
from tests.server.kubepeer import run_exec
from tests.ssh_support import OpenSsh, keys, known_hosts_line, openssh, secret
from tests.support import Backend, Standalone, start_standalone

V5 = "v5.channel.k8s.io"
STEP = 20.0
CONSOLE = {
    "endpoint": ".status.console.endpoint",
    "require": {".status.phase": ["Running"]},
    "ssh": {"credentials": ".spec.console.sshSecret", "hostKey": ".status.console.hostKey"},
}
PORTFORWARD = {
    "address": ".status.portForward.address",
    "ports": ".status.portForward.ports",
    "ssh": {"credentials": ".spec.portForward.sshSecret", "via": ".status.portForward.jumpHost"},
}


def config(tmp: Path) -> dict[str, Any]:
    return {
        "endpointPolicy": {
            "schemes": ["tcp", "unix", "ssh"],
            "allowCIDRs": ["127.0.0.0/8"],
            "socketDirs": [str(tmp)],
        },
        "parents": [
            {
                "resource": "machines",
                "kind": "Machine",
                "source": {"group": "subres.dev", "version": "v1alpha1"},
                "subresources": {"console": CONSOLE, "portforward": PORTFORWARD},
            }
        ],
    }


def machine(
    name: str, *, console: str = "", secret_name: str = "login", host_key: str = "",
    forward: tuple[str, list[int], str] | None = None,
) -> dict[str, Any]:  # fmt: skip
    status: dict[str, Any] = {"console": {"endpoint": console}}
    if host_key:
        status["console"]["hostKey"] = host_key
    spec: dict[str, Any] = {"console": {"sshSecret": secret_name}}
    if forward is not None:
        address, ports, jump = forward
        status["portForward"] = {"address": address, "ports": ports, "jumpHost": jump}
        spec["portForward"] = {"sshSecret": secret_name}
    return support.machine(name, spec=spec, status=status)


@dataclass
class Setup:
    subres: Standalone
    sshd: OpenSsh
    echo: Backend

    def connections(self) -> int:
        """Logins sshd accepted so far."""
        return self.sshd.logs().count("Accepted publickey")

    def attempts(self) -> int:
        """TCP connections sshd saw so far."""
        return self.sshd.logs().count("Connection from")


@pytest.fixture
async def setup(tmp_path: Path, backend: Backend) -> AsyncIterator[Setup]:
    async with openssh(tmp_path / "sshd") as sshd:
        login = sshd.keys.user_private()
        echo_port = int(backend.url.rsplit(":", 1)[1])
        objects = [
            secret("login", {"ssh-privatekey": login, "known_hosts": sshd.known_hosts()}),
            secret("keyonly", {"ssh-privatekey": login}),
            secret("stranger", {"ssh-privatekey": login,
                                "known_hosts": known_hosts_line(keys().host, sshd.port)}),
            secret("wrongkey", {"ssh-privatekey": keys().user_private(),
                                "known_hosts": sshd.known_hosts()}),
            machine("shell", console=sshd.url),
            machine("pinned", console=sshd.url, secret_name="keyonly",
                    host_key=sshd.keys.fingerprint),
            machine("stranger", console=sshd.url, secret_name="stranger"),
            machine("wrongkey", console=sshd.url, secret_name="wrongkey"),
            machine("nosecret", console=sshd.url, secret_name="missing"),
            machine("jump", forward=("127.0.0.1", [echo_port, 1], sshd.url)),
            machine("far", forward=("10.1.2.3", [22], sshd.url)),
            machine("direct", forward=("127.0.0.1", [echo_port], "")),
            machine("farjump", forward=("127.0.0.1", [echo_port], "ssh://root@10.9.9.9")),
        ]  # fmt: skip
        async with start_standalone(
            tmp_path, *objects, config=config(tmp_path), session={"connectTimeout": 3}
        ) as subres:
            yield Setup(subres, sshd, backend)


def ws(subres: Standalone, path: str, *protocols: str) -> connect:
    """A WebSocket to `machine[/subresource…]` (console when no subresource is named)."""
    return subres.websocket(subres.url(*path.split("/", 1)), *protocols)


async def stdout_until(conn: ClientConnection, pattern: bytes, *, framed: bool = True) -> bytes:
    seen = b""
    async with asyncio.timeout(STEP):
        while not re.search(pattern, seen):
            message = await conn.recv()
            assert isinstance(message, bytes)
            if not framed:
                seen += message
            elif message[:1] == b"\x01":
                seen += message[1:]
    return seen


async def error_channel(conn: ClientConnection) -> dict[str, Any]:
    """Messages until the error channel's Status (bounded)."""
    async with asyncio.timeout(STEP):
        while True:
            message = await conn.recv()
            assert isinstance(message, bytes)
            if message[:1] == b"\x03":
                status: dict[str, Any] = json.loads(message[1:])
                return status


async def test_v5_console_types_resizes_and_reports_the_exit_status(setup: Setup) -> None:
    async with ws(setup.subres, "shell", V5) as conn:
        await conn.send(b"\x00stty size; echo TERM=$TERM\r")
        await stdout_until(conn, rb"24 80\r\nTERM=xterm-256color")
        await conn.send(b"\x04" + json.dumps({"Width": 132, "Height": 50}).encode())
        await conn.send(b"\x00stty size\r")
        await stdout_until(conn, rb"[\r\n]50 132\r\n")
        await conn.send(b"\x00exit 3\r")
        status = await error_channel(conn)
        assert status["reason"] == "NonZeroExitCode"
        assert status["details"]["causes"] == [{"reason": "ExitCode", "message": "3"}]
        with pytest.raises(websockets.ConnectionClosed):
            await asyncio.wait_for(conn.recv(), STEP)
        assert conn.close_code == 1000


@pytest.mark.parametrize("transport", ["spdy", "websocket"])
async def test_client_go_exec_exits_with_the_ssh_commands_status(
    setup: Setup, kubepeer_bin: Path, transport: str
) -> None:
    result = await run_exec(
        kubepeer_bin, setup.subres, "shell", b"echo sub$((40+2))res; exit 5\r", transport=transport
    )
    assert result.code == 5 and b"sub42res" in result.stdout, result.stderr


async def test_a_clean_exit_is_success(setup: Setup) -> None:
    async with ws(setup.subres, "shell", V5) as conn:
        await conn.send(b"\x00exit\r")
        assert (await error_channel(conn))["status"] == "Success"


async def test_raw_console_and_a_pinned_fingerprint(setup: Setup) -> None:
    async with ws(setup.subres, "pinned", "plain.kubevirt.io") as conn:
        await conn.send(b"echo sub$((40+2))res\r")
        await stdout_until(conn, b"sub42res", framed=False)


async def test_concurrent_consoles_share_one_ssh_connection(setup: Setup) -> None:
    async with ws(setup.subres, "shell", V5) as a, ws(setup.subres, "pinned", V5) as b:
        for conn in (a, b):
            await conn.send(b"\x00echo sub$((40+2))res\r")
            await stdout_until(conn, b"sub42res")
        # shell and pinned trust the host differently: two connections, not one per session.
        async with ws(setup.subres, "shell", V5) as c:
            await c.send(b"\x00echo sub$((40+2))res\r")
            await stdout_until(c, b"sub42res")
        assert setup.connections() == 2


async def test_a_dying_sshd_ends_the_session_with_1011_and_a_reason(setup: Setup) -> None:
    async with ws(setup.subres, "shell", V5) as conn:
        await conn.send(b"\x00echo sub$((40+2))res\r")
        await stdout_until(conn, b"sub42res")
        await setup.sshd.kill()
        with pytest.raises(websockets.ConnectionClosed):
            async with asyncio.timeout(STEP):
                while True:
                    await conn.recv()
        assert conn.close_code == 1011
        assert conn.close_reason is not None and "SSH connection was lost" in conn.close_reason


async def refusal(subres: Standalone, path: str) -> tuple[int, str]:
    code, status = await subres.refused(subres.url(*path.split("/", 1)), "plain.kubevirt.io")
    return code, str(status["message"])


@pytest.mark.parametrize(
    ("path", "code", "words"),
    [
        ("stranger", 502, "offered host key {fingerprint}, which the Secret's known_hosts"),
        ("wrongkey", 502, "refused the credentials of user 'root'"),
        ("nosecret", 400, "Secret 'missing' with the SSH credentials does not exist"),
    ],
)
async def test_console_refusals_are_statuses(
    setup: Setup, path: str, code: int, words: str
) -> None:
    got = await refusal(setup.subres, path)
    expected = words.format(fingerprint=setup.sshd.keys.fingerprint).replace(
        "'root'", repr(setup.sshd.user)
    )
    assert got[0] == code and expected in got[1], got


async def test_port_forward_through_the_jump_host(setup: Setup) -> None:
    port = int(setup.echo.url.rsplit(":", 1)[1])
    payload = os.urandom(8 << 20)
    async with ws(setup.subres, f"jump/portforward/{port}", "plain.kubevirt.io") as conn:

        async def send() -> None:
            for offset in range(0, len(payload), 1 << 16):
                await conn.send(payload[offset : offset + (1 << 16)])

        async def receive() -> bytes:
            got = bytearray()
            while len(got) < len(payload):
                message = await conn.recv()
                assert isinstance(message, bytes)
                got += message
            return bytes(got)

        async with asyncio.timeout(60):
            _, back = await asyncio.gather(send(), receive())
    assert hashlib.sha256(back).digest() == hashlib.sha256(payload).digest()
    assert setup.echo.accepted == 1
    assert setup.connections() == 1  # the bytes went through sshd


async def test_a_parent_that_names_no_jump_host_is_forwarded_directly(setup: Setup) -> None:
    port = int(setup.echo.url.rsplit(":", 1)[1])
    async with ws(setup.subres, f"direct/portforward/{port}", "plain.kubevirt.io") as conn:
        await conn.send(b"ping")
        assert await asyncio.wait_for(conn.recv(), STEP) == b"ping"
    assert setup.echo.accepted == 1 and setup.attempts() == 0


@pytest.mark.parametrize(
    ("path", "code", "words"),
    [
        ("far/portforward/22", 403, "address 10.1.2.3 is not allowed"),
        ("farjump/portforward/{echo}", 403, "address 10.9.9.9 is not allowed"),
        ("jump/portforward/{echo}/udp", 400, "only TCP can be forwarded through an SSH jump host"),
        ("jump/portforward/1", 502, "refused the channel"),
    ],
)
async def test_port_forward_refusals(setup: Setup, path: str, code: int, words: str) -> None:
    before = setup.attempts()
    port = setup.echo.url.rsplit(":", 1)[1]
    got = await refusal(setup.subres, path.format(echo=port))
    assert got[0] == code and words in got[1], got
    if code != 502:  # refused before any SSH connection was made
        assert setup.attempts() == before
    assert setup.echo.accepted == 0
