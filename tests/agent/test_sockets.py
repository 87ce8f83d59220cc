"""Sockets that cannot be swapped: the agent follows no link and dials only its owner's listeners.

The socket directory belongs to a VM runtime's user (65534 here); whoever
writes there (the runtime, a compromised guest runtime) may put any link or
socket in place of a machine's. A root-owned socket stands for the CRI
runtime's. Real processes of both users listen; the agent is the real one,
asked over mutual TLS as a replica asks it. The swap race runs in a process
of its own, as an attacker's would.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from subres.agent.run import Agent
from subres.backends import nofollow
from subres.backends.stream import BackendUnavailable
from subres.protocol import relay
from subres.serving import certs
from tests.agent.conftest import NAMESPACE, AgentPKI, agent_options, write_pki
from tests.support import Backend, wait_for

RUNTIME_UID = 65534
"""The VM runtime's user: owner of the socket directory and of every machine's socket."""
START = 10.0
LISTENER = """
import socket, sys
server = socket.socket(socket.AF_UNIX)
server.bind(sys.argv[1])
server.listen(64)
print("ready", flush=True)
while True:
    conn, _ = server.accept()
    conn.sendall(b"runtime\\n")
    conn.close()
"""
SWAPPER = """
import os, sys
path, legit, target = sys.argv[1:]
def hold():
    # Each state lasts as long as the other, whatever the load: a swapper that spent most
    # of its time in one state once let only 2 of 2,000 dials meet the other.
    for _ in range(200):
        os.stat(path, follow_symlinks=False)
def swap():
    os.link(legit, path + ".real")  # the runtime's own socket, once more under `path`
    os.replace(path + ".real", path)
    hold()
    os.symlink(target, path + ".link")  # then a link to root's socket in its place
    os.replace(path + ".link", path)
    hold()
swap()
print("ready", flush=True)
while True:
    swap()
"""


@dataclass
class Node:
    """A node's socket directory, owned by the runtime, and the root-owned socket beside it."""

    dir: Path
    """The agent's socket directory (owner: the runtime's user)."""
    root_socket: Backend
    """A root-owned listener that must never be reached (the CRI socket)."""


@pytest.fixture
def node_dirs() -> Iterator[Path]:
    assert os.geteuid() == 0, "the suite runs as root (scripts/test installs packages)"
    # Under /tmp, not pytest's 0700 tmp_path: the runtime's user must reach its directory.
    with tempfile.TemporaryDirectory(prefix="subres-node-") as top:
        os.chmod(top, 0o755)
        vms = Path(top) / "vms"
        vms.mkdir()
        os.chown(vms, RUNTIME_UID, RUNTIME_UID)
        (Path(top) / "host").mkdir()
        yield Path(top)


@pytest.fixture
async def node(node_dirs: Path) -> AsyncIterator[Node]:
    root_socket = await Backend().start_unix(node_dirs / "host" / "cri.sock")
    try:
        yield Node(node_dirs / "vms", root_socket)
    finally:
        await root_socket.stop()


@asynccontextmanager
async def runtime_listener(path: Path) -> AsyncIterator[None]:
    """A listener at `path` run by the runtime's user (its socket file is theirs)."""
    python = shutil.which("python3", path="/usr/bin:/bin")
    assert python, "Debian's python3 runs the runtime's listener"
    setpriv = ["setpriv", f"--reuid={RUNTIME_UID}", f"--regid={RUNTIME_UID}", "--clear-groups"]
    async with _process(*setpriv, python, "-c", LISTENER, str(path)):
        yield


@asynccontextmanager
async def _process(*argv: str) -> AsyncIterator[None]:
    proc = await asyncio.create_subprocess_exec(*argv, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(START):
            assert await proc.stdout.readline() == b"ready\n"
        yield
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


@asynccontextmanager
async def agent_for(node: Node, tmp_path: Path) -> AsyncIterator[tuple[Agent, AgentPKI]]:
    pki = write_pki(tmp_path / "pki")
    owners = {node.dir: (RUNTIME_UID, RUNTIME_UID)}
    agent = Agent(agent_options(pki, "node-a", node.dir, socket_owners=owners))
    await agent.start()
    try:
        yield agent, pki
    finally:
        await agent.stop()


def replica_tls(pki: AgentPKI, tmp_path: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca_file))
    certs.issue_replica_client(pki.ca).write(tmp_path / "r.crt", tmp_path / "r.key")
    context.load_cert_chain(tmp_path / "r.crt", tmp_path / "r.key")
    return context


async def ask(
    agent: Agent, context: ssl.SSLContext, path: Path, *, after: bool = True
) -> tuple[int, bytes]:
    """One relay request for `path`; the status code and (with `after`) the first bytes
    after the head: a refusal's Status, or the backend's first frame."""
    reader, writer = await asyncio.open_connection(
        "127.0.0.1",
        agent.port,
        ssl=context,
        server_hostname=f"{certs.AGENT_SERVICE}.{NAMESPACE}.svc",
    )
    try:
        writer.write(
            f"POST {relay.PATH} HTTP/1.1\r\nHost: agent\r\nConnection: Upgrade\r\n"
            f"Upgrade: {relay.UPGRADE}\r\n{relay.ENDPOINT_HEADER}: unix://{path}\r\n"
            "Content-Length: 0\r\n\r\n".encode()
        )
        async with asyncio.timeout(START):
            head = await reader.readuntil(b"\r\n\r\n")
            return int(head.split(b" ", 2)[1]), await reader.read(4096) if after else b""
    finally:
        writer.close()


async def test_a_symlink_to_a_root_socket_is_refused_and_root_never_sees_a_connection(
    node: Node, tmp_path: Path
) -> None:
    inside = node.dir / "cri-here.sock"  # root's socket right in the runtime's directory
    stranger = await Backend().start_unix(inside)
    (node.dir / "vm1.sock").symlink_to(node.root_socket.url.removeprefix("unix://"))
    (node.dir / "vm2.sock").symlink_to(inside)
    (node.dir / "sub").symlink_to(node.root_socket.url.removeprefix("unix://").rsplit("/", 1)[0])
    try:
        async with agent_for(node, tmp_path) as (agent, pki):
            context = replica_tls(pki, tmp_path)
            for name in ("vm1.sock", "vm2.sock", "sub/cri.sock", "cri-here.sock"):
                code, body = await ask(agent, context, node.dir / name)
                assert code == 403, (name, body)
                assert b"symbolic link" in body or b"belongs to uid 0, gid 0" in body, body
        assert node.root_socket.accepted == 0
        assert stranger.accepted == 0
    finally:
        await stranger.stop()


async def test_the_runtimes_own_socket_is_relayed(node: Node, tmp_path: Path) -> None:
    async with (
        runtime_listener(node.dir / "vm1.sock"),
        agent_for(node, tmp_path) as (agent, pki),
    ):
        code, body = await ask(agent, replica_tls(pki, tmp_path), node.dir / "vm1.sock")
    assert code == 101
    assert b"runtime\n" in body  # the listener's greeting, in the relay's first frame


async def test_a_socket_swapped_for_a_link_in_a_loop_never_reaches_root(
    node: Node, tmp_path: Path
) -> None:
    path, legit = node.dir / "vm1.sock", node.dir / "legit.sock"
    target = node.root_socket.url.removeprefix("unix://")
    outcomes = {"relayed": 0, "refused": 0}
    async with (
        runtime_listener(legit),
        agent_for(node, tmp_path) as (agent, pki),
        _process(sys.executable, "-c", SWAPPER, str(path), str(legit), target),
    ):
        context = replica_tls(pki, tmp_path)
        for _ in range(2000):  # bounded: stop once both outcomes were seen often enough
            code, _ = await ask(agent, context, path, after=False)
            outcomes["relayed" if code == 101 else "refused"] += 1
            if node.root_socket.accepted or min(outcomes.values()) >= 25:
                break
    assert node.root_socket.accepted == 0, outcomes
    assert min(outcomes.values()) >= 25, outcomes  # the race really ran both ways


@contextmanager
def walking() -> Iterator[None]:
    """As on a kernel without openat2: a component at a time."""
    saved = nofollow._Openat2.works
    nofollow._Openat2.works = False
    try:
        yield
    finally:
        nofollow._Openat2.works = saved


@pytest.mark.parametrize("openat2", [True, False])
async def test_links_anywhere_on_the_way_and_foreign_owners_are_refused(
    node: Node, openat2: bool
) -> None:
    directory = nofollow.SocketDir(str(node.dir), str(node.dir), RUNTIME_UID, RUNTIME_UID)
    (node.dir / "link.sock").symlink_to(node.root_socket.url.removeprefix("unix://"))
    (node.dir / "host").symlink_to(node.dir.parent / "host")
    (node.dir / "plain").write_text("not a socket")
    refused = {
        "link.sock": "symbolic link",
        "host/cri.sock": "symbolic link or a non-directory on the way",
        "plain": "is not a socket",
        "plain/x.sock": "symbolic link or a non-directory on the way",
    }
    with walking() if not openat2 else contextlib.nullcontext():
        for name, reason in refused.items():
            with pytest.raises(nofollow.SocketRefused, match=reason):
                await dial(node.dir / name, directory)
        with pytest.raises(BackendUnavailable, match="No such file"):
            await dial(node.dir / "missing.sock", directory)
    assert node.root_socket.accepted == 0


async def test_a_listener_of_another_user_behind_a_file_of_the_owner_is_closed_unspoken_to(
    node: Node,
) -> None:
    # Root listens, then hands the file to the runtime's user: the file passes, the listener not.
    received: list[bytes] = []

    async def keep(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.append(await reader.read())

    listener = await Backend(handler=keep).start_unix(node.dir / "vm1.sock")
    os.chown(node.dir / "vm1.sock", RUNTIME_UID, RUNTIME_UID)
    directory = nofollow.SocketDir(str(node.dir), str(node.dir), RUNTIME_UID, RUNTIME_UID)
    try:
        with pytest.raises(nofollow.SocketRefused, match=r"the listener on .* runs as uid 0"):
            await dial(node.dir / "vm1.sock", directory)
        await wait_for(lambda: listener.accepted == 1 and listener.open == 0)
        assert received == [b""]  # connected to, never spoken to, closed
    finally:
        await listener.stop()


async def dial(path: Path, directory: nofollow.SocketDir) -> None:
    stream = await nofollow.dial(
        str(path), (directory,), connect_timeout=5, read_size=4096, write_timeout=5
    )
    await stream.close()
