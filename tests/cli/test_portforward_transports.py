"""`subres port-forward --transport spdy|tunnel`: the CLI against an in-process standalone server.

Every local connection must ride ONE upstream SPDY connection (counted in the
server's session registry), bytes must arrive intact both ways, half-close
must work, the server's error text must be printed and end only that local
connection, and a dropped upstream must be dialled again.
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest

from tests.cli.conftest import DEAD_PORT, run_cli, write_kubeconfig
from tests.cli.portforward_support import (
    TIMEOUT,
    echo_hashed,
    listening,
    round_trip,
    spawn,
    stderr_of,
    stop,
)
from tests.server.portforward_support import chunks, digest, port_of
from tests.support import Backend, Standalone, wait_for

SIZE = 16 << 20
TRANSPORTS = ["spdy", "tunnel"]
REFUSED = b"does not allow forwarding to tcp port 2"
DIAL_FAILED = b"cannot connect to tcp://127.0.0.1:1"

pytestmark = pytest.mark.parametrize("transport", TRANSPORTS)


def upstreams(subres: Standalone) -> int:
    """SPDY connections the server holds (port-forward only, in these tests)."""
    return len(subres.server.state.sessions)


async def test_bytes_hashed_over_one_upstream_and_half_close(
    subres: Standalone, backends: tuple[Backend, Backend], transport: str
) -> None:
    echo, summer = backends
    proc = await spawn(
        subres,
        "--transport",
        transport,
        "vm1",
        f"0:{port_of(echo.url)}",
        f"0:{port_of(summer.url)}",
    )
    try:
        echo_local, summer_local = await listening(proc, 2)
        # Three local connections open at once, each answered, on a single upstream.
        conns = [await asyncio.open_connection("127.0.0.1", echo_local) for _ in range(3)]
        async with asyncio.timeout(TIMEOUT):
            for i, (_, writer) in enumerate(conns):
                writer.write(b"hello %d" % i)
            for i, (reader, _) in enumerate(conns):
                assert await reader.readexactly(7) == b"hello %d" % i
        await echo.wait_open(3)
        assert upstreams(subres) == 1
        for _, writer in conns:
            writer.close()
        await echo.wait_open(0)

        digests = await asyncio.gather(*(echo_hashed(echo_local, SIZE) for _ in range(3)))
        assert list(digests) == [digest(SIZE)] * 3
        assert echo.accepted == 6
        assert upstreams(subres) == 1

        # The backend answers only after our EOF, and the answer still arrives.
        payload = b"".join(chunks(1 << 20, seed=5))
        assert (
            await round_trip(summer_local, payload) == hashlib.sha256(payload).hexdigest().encode()
        )
    finally:
        await stop(proc)
    assert proc.returncode == 0, await stderr_of(proc)
    await wait_for(lambda: upstreams(subres) == 0)  # the CLI hung up on its way out


async def test_failed_dial_prints_the_error_and_closes_only_that_connection(
    subres: Standalone, backends: tuple[Backend, Backend], transport: str
) -> None:
    echo, _ = backends
    args = ("--transport", transport, "vm1", f"0:{DEAD_PORT}", f"0:{port_of(echo.url)}")
    proc = await spawn(subres, *args)
    try:
        dead_local, echo_local = await listening(proc, 2)
        reader, writer = await asyncio.open_connection("127.0.0.1", dead_local)
        async with asyncio.timeout(TIMEOUT):
            assert await reader.read() == b""
        writer.close()
        assert proc.stderr is not None
        async with asyncio.timeout(TIMEOUT):
            line = await proc.stderr.readline()
        assert line.startswith(b"error: port 1: ") and DIAL_FAILED in line, line

        # The upstream and the other ports live on.
        assert await round_trip(echo_local, b"still here") == b"still here"
        assert upstreams(subres) == 1
    finally:
        await stop(proc)
    assert proc.returncode == 0


async def test_upstream_dialled_again_after_it_drops(
    subres: Standalone, backends: tuple[Backend, Backend], transport: str
) -> None:
    echo, _ = backends
    proc = await spawn(subres, "--transport", transport, "vm1", f"0:{port_of(echo.url)}")
    try:
        (local,) = await listening(proc, 1)
        assert await round_trip(local, b"first") == b"first"
        sessions = subres.server.state.sessions
        first = set(sessions.live)
        async with asyncio.timeout(TIMEOUT):
            await sessions.close_all("the test drops the upstream")
        # The first upstream is gone; the client may already have dialled the next one,
        # so "none live" could pass unseen between the two.
        await wait_for(lambda: not first & sessions.live)
        assert await round_trip(local, b"second") == b"second"
        assert upstreams(subres) == 1
    finally:
        await stop(proc)
    assert proc.returncode == 0, await stderr_of(proc)


async def test_stdio_pipes_half_close(
    subres: Standalone, backends: tuple[Backend, Backend], transport: str
) -> None:
    _, summer = backends
    proc = await spawn(
        subres,
        "--transport",
        transport,
        "--stdio",
        "vm1",
        str(port_of(summer.url)),
        stdin=asyncio.subprocess.PIPE,
    )
    payload = b"".join(chunks(4 << 20, seed=9))
    async with asyncio.timeout(TIMEOUT):
        out, err = await proc.communicate(payload)
    assert proc.returncode == 0, err
    assert out == hashlib.sha256(payload).hexdigest().encode()


async def test_stdio_refused_port_exits_with_the_error(subres: Standalone, transport: str) -> None:
    proc = await spawn(
        subres, "--transport", transport, "--stdio", "vm1", "2", stdin=asyncio.subprocess.PIPE
    )
    async with asyncio.timeout(TIMEOUT):
        out, err = await proc.communicate(b"")
    assert proc.returncode == 1
    assert out == b""
    assert err.startswith(b"error: ") and REFUSED in err, err


def test_udp_is_refused_before_connecting(workdir: Path, transport: str) -> None:
    kubeconfig = write_kubeconfig(workdir / "kubeconfig", server="https://127.0.0.1:1")
    result = run_cli(
        ["--kubeconfig", kubeconfig, "port-forward", "--transport", transport, "vm1", "udp/53"],
        home=workdir,
    )
    assert result.returncode == 1
    assert b"carries tcp only; use --transport websocket for udp" in result.stderr


async def test_refused_upgrade_prints_the_status_message(
    subres: Standalone, transport: str
) -> None:
    proc = await spawn(
        subres, "--transport", transport, "--stdio", "vm9", "22", stdin=asyncio.subprocess.PIPE
    )
    async with asyncio.timeout(TIMEOUT):
        _, err = await proc.communicate(b"")
    assert proc.returncode == 1
    assert err == (
        b"Error from server (NotFound): "
        b'machines.subres.dev "vm9" not found in namespace "default"\n'
    ), err
