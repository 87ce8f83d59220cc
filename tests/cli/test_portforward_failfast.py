"""`subres port-forward` fails before it listens, as kubectl does, and listens as kubectl does.

Credentials, the machine, its state and the ports are checked before any
`Forwarding from` line, with exit code 1 and kubectl's words, and without
dialing the machine; the default listeners are 127.0.0.1 and ::1.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import yaml

from tests.cli.conftest import cli, cli_env, write_kubeconfig
from tests.cli.portforward_support import TIMEOUT, listening, round_trip, spawn, stop
from tests.server.portforward_support import pf_machine, port_of
from tests.support import Backend, Standalone, start_standalone


@pytest.fixture
async def server(tmp_path: Path, backends: tuple[Backend, Backend]) -> AsyncIterator[Standalone]:
    """vm1 allows the echo backend's port; `off` is the same machine, stopped."""
    echo, _ = backends
    port = port_of(echo.url)
    machines = (pf_machine("vm1", [port]), pf_machine("off", [port], phase="Stopped"))
    async with start_standalone(tmp_path, *machines) as s:
        yield s


async def _refused(server: Standalone, *args: str, kubeconfig: Path | None = None) -> str:
    """Run the CLI, which must exit 1 without printing a listener; its stderr."""
    proc = await asyncio.create_subprocess_exec(
        *cli("--kubeconfig", kubeconfig or server.kubeconfig(), "port-forward", *args),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=cli_env(server.dir),
    )
    async with asyncio.timeout(TIMEOUT):
        out, err = await proc.communicate()
    assert (proc.returncode, out) == (1, b""), err
    return err.decode()


async def test_missing_machine(server: Standalone, backends: tuple[Backend, Backend]) -> None:
    err = await _refused(server, "vm9", "0:22")
    assert err == (
        'Error from server (NotFound): machines.subres.dev "vm9" not found in namespace "default"\n'
    )


async def test_stopped_machine(server: Standalone, backends: tuple[Backend, Backend]) -> None:
    err = await _refused(server, "off", f"0:{port_of(backends[0].url)}")
    assert err.startswith("Error from server (Conflict): Machine default/off is not Running")


async def test_port_not_allowed_and_nothing_dialed(
    server: Standalone, backends: tuple[Backend, Backend]
) -> None:
    echo, _ = backends
    err = await _refused(server, "vm1", f"0:{port_of(echo.url)}", "0:2")
    assert err == (
        "Error from server (Forbidden): Machine default/vm1 does not allow forwarding "
        "to tcp port 2\n"
    )
    assert echo.accepted == 0


async def test_bad_token(server: Standalone, backends: tuple[Backend, Backend]) -> None:
    doc = yaml.safe_load(server.kubeconfig().read_text())
    doc["users"][0]["user"]["token"] = "wrong"
    bad = server.dir / "bad-kubeconfig"
    bad.write_text(yaml.safe_dump(doc))
    err = await _refused(server, "vm1", f"0:{port_of(backends[0].url)}", kubeconfig=bad)
    assert err == "error: You must be logged in to the server (Unauthorized)\n"


async def test_dead_server(server: Standalone, workdir: Path) -> None:
    dead = write_kubeconfig(workdir / "kubeconfig", server="http://127.0.0.1:1")
    err = await _refused(server, "vm1", "0:22", kubeconfig=dead)
    assert err == (
        "error: cannot connect to http://127.0.0.1:1: connection refused; "
        "is the server running? check --kubeconfig/--context\n"
    )


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port held on 127.0.0.1 only."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield held.getsockname()[1]


async def test_a_busy_address_is_a_warning_while_another_listens(
    server: Standalone, backends: tuple[Backend, Backend], busy_port: int
) -> None:
    echo, _ = backends
    proc = await spawn(server, "vm1", f"{busy_port}:{port_of(echo.url)}")
    try:
        assert proc.stdout is not None and proc.stderr is not None
        async with asyncio.timeout(TIMEOUT):
            line = await proc.stdout.readline()
            warning = await proc.stderr.readline()
        assert line == f"Forwarding from [::1]:{busy_port} -> {port_of(echo.url)}/tcp\n".encode()
        assert warning == (
            f"warning: cannot listen on 127.0.0.1:{busy_port}: Address already in use\n".encode()
        )
    finally:
        await stop(proc)


async def test_no_address_to_listen_on(
    server: Standalone, backends: tuple[Backend, Backend], busy_port: int
) -> None:
    err = await _refused(
        server, "--address", "127.0.0.1", "vm1", f"{busy_port}:{port_of(backends[0].url)}"
    )
    assert err == f"error: cannot listen on 127.0.0.1:{busy_port}: Address already in use\n"


async def test_both_loopbacks_forward(
    server: Standalone, backends: tuple[Backend, Backend]
) -> None:
    echo, _ = backends
    proc = await spawn(server, "vm1", f"0:{port_of(echo.url)}")
    try:
        (local,) = await listening(proc, 1)
        assert await round_trip(local, b"over ipv4") == b"over ipv4"
        reader, writer = await asyncio.open_connection("::1", local)
        writer.write(b"over ipv6")
        writer.write_eof()
        async with asyncio.timeout(TIMEOUT):
            assert await reader.read() == b"over ipv6"
        writer.close()
    finally:
        await stop(proc)
    assert proc.returncode == 0
