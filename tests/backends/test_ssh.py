"""The SSH backend against real OpenSSH sshd and an asyncssh server, below the HTTP layer.

Consoles are PTY sessions whose size `stty` reports and whose resizes reach
the server as window changes; exit statuses and signals come back; a
direct-tcpip forward carries 64 MiB with equal hashes; one connection serves
concurrent sessions and closes when idle; and every refusal (credentials,
host keys, unreachable, refused channel, hostile servers) is an `SshError`
with its code, within the connect timeout, leaving no task or descriptor.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from subres.backends import endpoint, ssh
from subres.backends.sshstream import ChannelStream
from subres.config import EndpointPolicySpec
from subres.protocol.channels import TerminalSize
from tests.ssh_support import PASSWORD, OpenSsh, SshServer, keys, known_hosts_line, openssh
from tests.support import Backend, open_sockets, wait_for

CONNECT_TIMEOUT = 3.0
POLICY = EndpointPolicySpec(
    schemes=("ssh", "tcp"), allow_cidrs=(ipaddress.ip_network("127.0.0.0/8"),), deny_cidrs=()
)
STEP = 20.0
"""Bound on one step of a conversation with a shell."""


async def target(url: str) -> endpoint.Target:
    return await endpoint.check(endpoint.parse(url), POLICY)


@pytest.fixture
async def pool() -> AsyncIterator[ssh.Pool]:
    p = ssh.Pool(ssh.Settings(connect_timeout=CONNECT_TIMEOUT, idle_timeout=0.3))
    yield p
    await p.close()


@pytest.fixture
async def sshd(tmp_path: Path) -> AsyncIterator[OpenSsh]:
    async with openssh(tmp_path / "sshd") as server:
        yield server


def key_login(server: OpenSsh) -> tuple[ssh.Credentials, ssh.HostTrust]:
    return (
        ssh.Credentials(server.user, private_key=server.keys.user_private()),
        ssh.HostTrust(known_hosts=server.known_hosts()),
    )


async def until(stream: ChannelStream, pattern: bytes) -> re.Match[bytes]:
    """Read until `pattern` matches what arrived (bounded)."""
    seen = b""
    async with asyncio.timeout(STEP):
        while (match := re.search(pattern, seen)) is None:
            chunk = await stream.read()
            assert chunk, f"EOF before {pattern!r}; got {seen[-500:]!r}"
            seen += chunk
    return match


async def drain(stream: ChannelStream) -> bytes:
    """Everything until EOF (bounded)."""
    got = b""
    async with asyncio.timeout(STEP):
        while chunk := await stream.read():
            got += chunk
    return got


async def lost(stream: ChannelStream) -> str:
    """Read until the stream fails; the reason it gives (bounded)."""
    with pytest.raises(ConnectionResetError) as info:
        await drain(stream)
    return str(info.value)


async def test_console_is_a_pty_with_term_and_size_and_resizes_reach_it(
    pool: ssh.Pool, sshd: OpenSsh
) -> None:
    creds, trust = key_login(sshd)
    console = await pool.console(await target(sshd.url), creds, trust, term="xterm-256color")
    try:
        await console.write(b"stty size; echo TERM=$TERM\r")
        await until(console, rb"24 80\r\nTERM=xterm-256color")
        console.resize(TerminalSize(width=132, height=50))
        await console.write(b"stty size\r")
        await until(console, rb"[\r\n]50 132\r\n")
        await console.write(b"exit 7\r")
        await drain(console)
        assert console.exit_code == 7 and not console.failure
    finally:
        await console.close()


@pytest.mark.parametrize(
    ("command", "code"),
    [("sh -c 'exit 3'", 3), ("sh -c 'kill -TERM $$'", 128 + 15), ("true", 0)],
)
async def test_a_configured_command_reports_its_exit_status_or_signal(
    pool: ssh.Pool, sshd: OpenSsh, command: str, code: int
) -> None:
    creds, trust = key_login(sshd)
    console = await pool.console(
        await target(sshd.url), creds, trust, term="vt100", command=command
    )
    try:
        await drain(console)
        assert console.exit_code == code
    finally:
        await console.close()


async def test_stdin_eof_ends_a_reading_command(pool: ssh.Pool, sshd: OpenSsh) -> None:
    creds, trust = key_login(sshd)
    console = await pool.console(await target(sshd.url), creds, trust, term="vt100", command="cat")
    try:
        await console.write(b"hello\r")
        await until(console, rb"hello\r\n")
        await console.write_eof()  # a PTY hears Ctrl+D; cat ends
        await drain(console)
        assert console.exit_code == 0
    finally:
        await console.close()


async def test_forward_carries_64_mib_through_sshd_intact(
    pool: ssh.Pool, sshd: OpenSsh, backend: Backend
) -> None:
    creds, trust = key_login(sshd)
    port = int(backend.url.rsplit(":", 1)[1])
    stream = await pool.forward(await target(sshd.url), creds, trust, host="127.0.0.1", port=port)
    size = 64 << 20
    sent, back = hashlib.sha256(), hashlib.sha256()

    async def send() -> None:
        for _ in range(size // (1 << 20)):
            chunk = os.urandom(1 << 20)
            sent.update(chunk)
            await stream.write(chunk)
        await stream.write_eof()

    async def receive() -> int:
        got = 0
        while chunk := await stream.read():
            back.update(chunk)
            got += len(chunk)
        return got

    try:
        async with asyncio.timeout(120):
            _, got = await asyncio.gather(send(), receive())
        assert got == size and sent.digest() == back.digest()
    finally:
        await stream.close()


async def test_concurrent_sessions_share_one_connection_closed_when_idle(
    pool: ssh.Pool, sshd: OpenSsh
) -> None:
    creds, trust = key_login(sshd)
    where = await target(sshd.url)
    consoles = await asyncio.gather(
        *(pool.console(where, creds, trust, term="vt100", command="cat") for _ in range(3))
    )
    assert len(pool) == 1
    assert sshd.logs().count("Accepted publickey") == 1
    for console in consoles:
        await console.close()
    await wait_for(lambda: len(pool) == 0)  # idle_timeout 0.3 s
    again = await pool.console(where, creds, trust, term="vt100", command="cat")
    await again.close()
    assert sshd.logs().count("Accepted publickey") == 2


async def test_a_dying_server_ends_its_sessions_saying_so(pool: ssh.Pool, sshd: OpenSsh) -> None:
    creds, trust = key_login(sshd)
    console = await pool.console(await target(sshd.url), creds, trust, term="vt100", command="cat")
    try:
        await sshd.kill()
        assert "SSH connection was lost" in await lost(console)
        await wait_for(lambda: len(pool) == 0)
    finally:
        await console.close()


# -- refusals -------------------------------------------------------------------------


async def refused(
    pool: ssh.Pool, url: str, creds: ssh.Credentials, trust: ssh.HostTrust, **kw: object
) -> ssh.SshError:
    """Open a console that must fail; no task or connection may stay behind."""
    tasks, fds = len(asyncio.all_tasks()), open_sockets()
    with pytest.raises(ssh.SshError) as info:
        async with asyncio.timeout(CONNECT_TIMEOUT + 5):
            if kw.get("forward"):
                await pool.forward(
                    await target(url), creds, trust, host="127.0.0.1", port=int(str(kw["forward"]))
                )
            else:
                await pool.console(await target(url), creds, trust, term="vt100")
    await pool.close()
    await wait_for(lambda: len(asyncio.all_tasks()) <= tasks and open_sockets() <= fds)
    return info.value


async def test_wrong_key_is_refused_by_sshd(pool: ssh.Pool, sshd: OpenSsh) -> None:
    creds = ssh.Credentials(sshd.user, private_key=keys().user_private())
    error = await refused(pool, sshd.url, creds, ssh.HostTrust(known_hosts=sshd.known_hosts()))
    assert error.code == 502 and f"refused the credentials of user {sshd.user!r}" in str(error)


async def test_an_unknown_host_key_is_refused_naming_the_offered_fingerprint(
    pool: ssh.Pool, sshd: OpenSsh
) -> None:
    creds, _ = key_login(sshd)
    stranger = ssh.HostTrust(known_hosts=known_hosts_line(keys().host, sshd.port))
    error = await refused(pool, sshd.url, creds, stranger)
    assert error.code == 502
    assert f"offered host key {sshd.keys.fingerprint}" in str(error) and "known_hosts" in str(error)
    error = await refused(pool, sshd.url, creds, ssh.HostTrust(fingerprint=keys().fingerprint))
    assert error.code == 502 and f"{sshd.keys.fingerprint}, which the pinned" in str(error)


async def test_a_pinned_fingerprint_is_enough(pool: ssh.Pool, sshd: OpenSsh) -> None:
    creds, _ = key_login(sshd)
    trust = ssh.HostTrust(fingerprint=sshd.keys.fingerprint)
    console = await pool.console(await target(sshd.url), creds, trust, term="vt100", command="true")
    await drain(console)
    await console.close()
    assert console.exit_code == 0


async def test_an_unreachable_server_is_503(pool: ssh.Pool, sshd: OpenSsh) -> None:
    creds, trust = key_login(sshd)
    await sshd.kill()
    error = await refused(pool, sshd.url, creds, trust)
    assert error.code == 503 and "cannot connect to SSH server" in str(error)


@pytest.mark.full  # OpenSSH's sshd: its logins need root
async def test_a_refused_forward_is_502(tmp_path: Path, pool: ssh.Pool, backend: Backend) -> None:
    port = backend.url.rsplit(":", 1)[1]
    async with openssh(tmp_path / "noforward", options="AllowTcpForwarding no\n") as sshd:
        creds, trust = key_login(sshd)
        error = await refused(pool, sshd.url, creds, trust, forward=port)
    assert error.code == 502 and "refused the channel" in str(error)
    assert backend.accepted == 0


async def test_a_closed_target_port_is_502(pool: ssh.Pool, sshd: OpenSsh) -> None:
    creds, trust = key_login(sshd)
    error = await refused(pool, sshd.url, creds, trust, forward=1)
    assert error.code == 502 and "refused the channel" in str(error)


# -- an asyncssh server ---------------------------------------------------------------


@pytest.fixture
async def server() -> AsyncIterator[SshServer]:
    s = await SshServer().start()
    yield s
    await s.stop()


def password_login(
    server: SshServer, password: str = PASSWORD
) -> tuple[ssh.Credentials, ssh.HostTrust]:
    return ssh.Credentials("tester", password=password), ssh.HostTrust(server.known_hosts())


async def test_password_login_pty_and_window_changes(pool: ssh.Pool, server: SshServer) -> None:
    creds, trust = password_login(server)
    console = await pool.console(await target(server.url), creds, trust, term="xterm")
    try:
        await until(console, b"ready")
        assert server.terms == [("xterm", 80, 24)]
        console.resize(TerminalSize(100, 40))
        await until(console, b"size 100x40")
        await console.write(b"signal KILL\r")
        await drain(console)
        assert console.exit_code == 128 + 9
    finally:
        await console.close()


async def test_the_command_is_sent_as_given(pool: ssh.Pool, server: SshServer) -> None:
    creds, trust = password_login(server)
    console = await pool.console(
        await target(server.url), creds, trust, term="vt100", command="virsh console vm-1"
    )
    await until(console, b"ready")
    await console.write(b"exit 4\r")
    await drain(console)
    await console.close()
    assert server.commands == ["virsh console vm-1"] and console.exit_code == 4


async def test_a_wrong_password_is_502(pool: ssh.Pool, server: SshServer) -> None:
    creds, trust = password_login(server, "wrong")
    error = await refused(pool, server.url, creds, trust)
    assert error.code == 502 and "refused the credentials" in str(error)


async def test_a_forward_the_server_refuses_is_502(pool: ssh.Pool) -> None:
    server = await SshServer(allow_forwarding=False).start()
    try:
        creds, trust = password_login(server)
        error = await refused(pool, server.url, creds, trust, forward=22)
    finally:
        await server.stop()
    assert error.code == 502 and "refused the channel" in str(error)
    assert server.forwards == [("127.0.0.1", 22)]


async def test_a_window_that_never_opens_is_refused_within_the_timeout(pool: ssh.Pool) -> None:
    server = await SshServer(window=0).start()
    try:
        creds, trust = password_login(server)
        error = await refused(pool, server.url, creds, trust)
    finally:
        await server.stop()
    assert error.code == 503 and "no channel with room to send" in str(error)


async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(os.urandom(4096))
    await reader.read()


async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    for _ in range(100_000):  # far longer than any connect timeout
        writer.write(b"welcome, this banner never ends\r\n")
        await writer.drain()
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("handler", [garbage, endless])
async def test_hostile_banners_end_within_the_connect_timeout(
    pool: ssh.Pool, handler: object
) -> None:
    backend = await Backend(handler=handler).start_tcp()  # type: ignore[arg-type]
    try:
        url = backend.url.replace("tcp://", "ssh://x@")
        creds = ssh.Credentials("x", password="y")
        error = await refused(pool, url, creds, ssh.HostTrust(fingerprint=keys().fingerprint))
    finally:
        await backend.stop()
    assert error.code == 503 and f"within {CONNECT_TIMEOUT:g}s" in str(error)


async def test_a_server_that_drops_ends_sessions_and_is_dialed_afresh(
    pool: ssh.Pool, server: SshServer
) -> None:
    creds, trust = password_login(server)
    where = await target(server.url)
    first = await pool.console(where, creds, trust, term="vt100")
    await until(first, b"ready")
    server.drop()
    assert "SSH connection was lost" in await lost(first)
    await first.close()
    second = await pool.console(where, creds, trust, term="vt100")
    await until(second, b"ready")
    await second.close()
    assert len(server.connections) == 2


def test_credentials_from_a_secret_say_what_is_missing() -> None:
    with pytest.raises(ssh.SshError, match="'c' with the SSH credentials does not exist"):
        ssh.credentials(None, name="c", user="u")
    with pytest.raises(ssh.SshError, match="names an SSH user"):
        ssh.credentials({"password": b"p", "known_hosts": b"x"}, name="c", user="")
    with pytest.raises(ssh.SshError, match="neither ssh-privatekey nor password"):
        ssh.credentials({"known_hosts": b"x"}, name="c", user="u")
    with pytest.raises(ssh.SshError, match="no way to verify the SSH host key"):
        ssh.credentials({"password": b"p"}, name="c", user="u")
    creds, trust = ssh.credentials(
        {"username": b"admin", "password": b"p"}, name="c", user="", fingerprint="SHA256:x"
    )
    assert (creds.username, creds.password, trust.fingerprint) == ("admin", "p", "SHA256:x")
