"""`subres port-forward` end to end: the CLI process against an in-process standalone server."""

from __future__ import annotations

import asyncio
import hashlib
import socket
from pathlib import Path

import asyncssh
import pytest

from subres.cli.commands import PortSpec, parse_port
from tests.cli.conftest import cli
from tests.cli.portforward_support import TIMEOUT, echo_hashed, listening, spawn, stop
from tests.server.portforward_support import UdpEcho, chunks, digest, pf_machine, port_of
from tests.support import Backend, Standalone, start_standalone

SIZE = 32 << 20


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("22", PortSpec("tcp", 22, 22)),
        ("2222:22", PortSpec("tcp", 2222, 22)),
        (":22", PortSpec("tcp", 0, 22)),
        ("udp/5353:53", PortSpec("udp", 5353, 53)),
        ("TCP/8080", PortSpec("tcp", 8080, 8080)),
    ],
)
def test_port_syntax(text: str, spec: PortSpec) -> None:
    assert parse_port(text) == spec


async def test_many_ports_bytes_hashed_and_half_close(
    subres: Standalone, backends: tuple[Backend, Backend], udp: UdpEcho
) -> None:
    echo, summer = backends
    proc = await spawn(
        subres,
        "machine/vm1",
        f"0:{port_of(echo.url)}",
        f"0:{port_of(summer.url)}",
        f"udp/0:{udp.port}",
    )
    try:
        echo_local, summer_local, udp_local = await listening(proc, 3)
        loop = asyncio.get_running_loop()
        started = loop.time()
        digests = await asyncio.gather(echo_hashed(echo_local, SIZE), echo_hashed(echo_local, SIZE))
        rate = 2 * SIZE / (loop.time() - started) / 1e6
        print(f"CLI, two connections, {SIZE >> 20} MiB each way each: {rate:.0f} MB/s")
        assert list(digests) == [digest(SIZE)] * 2

        # Half-close: the backend answers only after our EOF, and the answer still arrives.
        reader, writer = await asyncio.open_connection("127.0.0.1", summer_local)
        payload = b"".join(chunks(1 << 20, seed=5))
        writer.write(payload)
        writer.write_eof()
        async with asyncio.timeout(TIMEOUT):
            assert await reader.read() == hashlib.sha256(payload).hexdigest().encode()
        writer.close()

        await udp_round_trip(udp_local, udp)
    finally:
        await stop(proc)
    assert proc.returncode == 0, await proc.stderr.read() if proc.stderr else b""


async def udp_round_trip(local: int, udp: UdpEcho) -> None:
    datagrams = [bytes([i]) * n for i, n in enumerate([1, 100, 1400, 9000, 30000, *range(2, 60)])]
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setblocking(False)
    sock.connect(("127.0.0.1", local))
    loop = asyncio.get_running_loop()
    try:
        got = []
        async with asyncio.timeout(TIMEOUT):
            for datagram in datagrams:
                await loop.sock_sendall(sock, datagram)
                got.append(await loop.sock_recv(sock, 65536))
        assert got == datagrams
        assert udp.received == datagrams
    finally:
        sock.close()


async def test_stdio_pipes_half_close(
    subres: Standalone, backends: tuple[Backend, Backend]
) -> None:
    _, summer = backends
    proc = await spawn(
        subres, "--stdio", "vm1", str(port_of(summer.url)), stdin=asyncio.subprocess.PIPE
    )
    payload = b"".join(chunks(4 << 20, seed=9))
    async with asyncio.timeout(TIMEOUT):
        out, err = await proc.communicate(payload)
    assert proc.returncode == 0, err
    assert out == hashlib.sha256(payload).hexdigest().encode()


async def test_refused_port_is_reported(subres: Standalone) -> None:
    proc = await spawn(subres, "--stdio", "vm1", "2", stdin=asyncio.subprocess.PIPE)
    async with asyncio.timeout(TIMEOUT):
        _, err = await proc.communicate(b"")
    assert proc.returncode == 1
    assert b"does not allow forwarding to tcp port 2" in err


class _Server(asyncssh.SSHServer):
    def begin_auth(self, username: str) -> bool:
        return False  # no authentication: this server exists only on loopback for the test


async def _sha_process(process: asyncssh.SSHServerProcess[bytes]) -> None:
    h = hashlib.sha256()
    while data := await process.stdin.read(65536):
        h.update(data)
    process.stdout.write(h.hexdigest().encode())
    process.exit(0)


async def test_ssh_through_stdio_as_proxy_command(tmp_path: Path) -> None:
    key = asyncssh.generate_private_key("ssh-ed25519")
    server = await asyncssh.listen(
        "127.0.0.1",
        0,
        server_host_keys=[key],
        server_factory=_Server,
        process_factory=_sha_process,
        encoding=None,
    )
    try:
        port = server.sockets[0].getsockname()[1]
        async with start_standalone(tmp_path, pf_machine("vm1", [port])) as subres:
            command = cli(
                "--kubeconfig", subres.kubeconfig(), "port-forward", "--stdio", "vm1", str(port)
            )
            payload = b"".join(chunks(2 << 20, seed=11))
            async with (
                asyncio.timeout(TIMEOUT),
                asyncssh.connect(
                    "vm1",
                    proxy_command=command,
                    known_hosts=None,
                    username="tester",
                    env=None,
                ) as conn,
            ):
                result = await conn.run("sha256", input=payload, encoding=None, check=True)
            assert result.stdout == hashlib.sha256(payload).hexdigest().encode()
    finally:
        server.close()
        await server.wait_closed()
