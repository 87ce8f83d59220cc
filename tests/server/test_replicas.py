"""Replicas that serve any client of any console: the owner holds it, the others relay.

Two real cluster-mode replicas and their Pods in the fake apiserver
(`tests.server.replicas`). Whichever replica a client reaches (its front),
the console's owner holds the slot and the observers; what everyone sees is
the same bytes, takeover and `preserveSession` work across replicas, a
console command's exit status reaches the client as it does on the owner, and
the sessions list is complete from either.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
import os
import ssl
import struct
import sys
from pathlib import Path

import aiohttp
import pytest
import yaml

from subres.auth.user import UserInfo
from subres.backends.agent import Request, open_relay
from subres.backends.peer import PATH, UPGRADE, PeerStream
from subres.demo.vnc import Display, VncServer
from subres.engine.upgrade import UpgradedSocket
from subres.kube.status import exited
from subres.protocol.relay import HEARTBEAT_HEADER as HEARTBEAT
from subres.server.run import Server
from subres.serving import certs
from subres.sessions import peer
from subres.sessions.modes import Mode
from subres.sessions.runtime import Who
from tests.server.replicas import (
    REPLICA_CA,
    as_user,
    echoes,
    owner_and_other,
    replicas,
    unit,
    url,
)
from tests.server.test_cluster import CLIENT_CA
from tests.server.test_cve_regressions import certificate_without_usages
from tests.server.test_session_ends import reset_after_hello
from tests.server.test_ssh_backend import CONSOLE
from tests.ssh_support import SshServer, secret
from tests.support import (
    GROUP_VERSION,
    LOOPBACK_POLICY,
    Backend,
    communicate,
    machine,
    relay_to_unix,
    wait_for,
)


async def test_an_observer_on_one_replica_sees_byte_for_byte_what_a_writer_on_the_other_sees(
    tmp_path: Path, backend: Backend
) -> None:
    async with replicas(tmp_path, backend) as (_, servers), aiohttp.ClientSession() as http:
        owner, other = owner_and_other(servers)
        async with (
            http.ws_connect(url(other, "console-observe"), **as_user(tmp_path, "olive")) as far,
            http.ws_connect(url(owner, "console-observe"), **as_user(tmp_path, "otto")) as near,
            http.ws_connect(url(other, "console"), **as_user(tmp_path, "alice")) as writer,
        ):
            sent = os.urandom(256 << 10)
            seen = {"writer": b"", "far": b"", "near": b""}
            for start in range(0, len(sent), 16 << 10):
                await writer.send_bytes(sent[start : start + (16 << 10)])
            for name, ws in (("writer", writer), ("far", far), ("near", near)):
                while len(seen[name]) < len(sent):
                    seen[name] += await ws.receive_bytes(timeout=10)
        digests = {name: hashlib.sha256(data).hexdigest() for name, data in seen.items()}
        assert digests == dict.fromkeys(seen, hashlib.sha256(sent).hexdigest())
        assert backend.accepted == 1  # one connection, held by the owner


@pytest.mark.parametrize("first_on_owner", [True, False])
async def test_a_console_taken_over_through_either_replica_closes_with_4001(
    tmp_path: Path, backend: Backend, first_on_owner: bool
) -> None:
    async with replicas(tmp_path, backend) as (_, servers), aiohttp.ClientSession() as http:
        owner, other = owner_and_other(servers)
        first, second = (owner, other) if first_on_owner else (other, owner)
        async with http.ws_connect(url(first, "console"), **as_user(tmp_path, "alice")) as ws1:
            await echoes(ws1, b"mine")
            async with http.ws_connect(url(second, "console"), **as_user(tmp_path, "bob")) as ws2:
                closing = await ws1.receive(timeout=5)
                assert closing.type == aiohttp.WSMsgType.CLOSE
                assert (closing.data, closing.extra) == (
                    4001,
                    "console of default/vm taken over by bob",
                )
                await echoes(ws2, b"now mine")
        await backend.wait_open(0)
        # Nothing is left behind on either side: no slot, no session, no peer session.
        await wait_for(lambda: not owner.state.sessions.exclusive)
        await wait_for(lambda: not owner.state.sessions.live and not other.state.sessions.live)


async def test_a_backend_failure_on_the_owner_reaches_a_client_of_the_other_replica_once(
    tmp_path: Path,
) -> None:
    resetting = await Backend(handler=reset_after_hello).start_tcp()
    try:
        async with (
            replicas(tmp_path, resetting) as (_, servers),
            aiohttp.ClientSession() as http,
        ):
            _, other = owner_and_other(servers)
            async with http.ws_connect(url(other, "console"), **as_user(tmp_path, "alice")) as ws:
                await ws.send_bytes(b"hello")
                closing = await ws.receive(timeout=5)
                while closing.type != aiohttp.WSMsgType.CLOSE:
                    closing = await ws.receive(timeout=5)
        # As a client of the owner reads it (test_session_ends), not wrapped a second time.
        assert (closing.data, closing.extra) == (
            1011,
            "backend connection failed: Connection reset by peer",
        )
    finally:
        await resetting.stop()


async def test_preserve_session_is_refused_through_the_other_replica_before_dialing(
    tmp_path: Path, backend: Backend
) -> None:
    async with replicas(tmp_path, backend) as (_, servers), aiohttp.ClientSession() as http:
        owner, other = owner_and_other(servers, "vnc")
        async with http.ws_connect(url(owner, "vnc"), **as_user(tmp_path, "alice")) as held:
            await echoes(held, b"rfb")
            accepted = backend.accepted
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await http.ws_connect(
                    url(other, "vnc", "?preserveSession=true"), **as_user(tmp_path, "bob")
                )
            assert refused.value.status == 409
            assert backend.accepted == accepted
            await echoes(held, b"still mine")
        await wait_for(lambda: not owner.state.sessions.exclusive)
        async with http.ws_connect(
            url(other, "vnc", "?preserveSession=true"), **as_user(tmp_path, "bob")
        ) as kept:
            await echoes(kept, b"free now")


async def v5_exit_status(ws: aiohttp.ClientWebSocketResponse, command: bytes) -> object:
    """Type `command` on a v5 console; the Status of its error channel once the server closed."""
    await ws.send_bytes(b"\x00" + command)
    status = None
    async with asyncio.timeout(10):
        async for message in ws:
            if message.type is aiohttp.WSMsgType.BINARY and message.data[:1] == b"\x03":
                status = json.loads(message.data[1:])
    assert ws.close_code == 1000
    return status


async def test_a_console_commands_exit_status_reaches_a_client_through_either_replica(
    tmp_path: Path, backend: Backend
) -> None:
    ssh = await SshServer().start()
    policy = LOOPBACK_POLICY | {"schemes": ["tcp", "ssh"]}
    source = {"group": "subres.dev", "version": "v1alpha1"}
    console_only = {"subresources": {"console": CONSOLE}, "source": source}
    parents = [{"resource": "machines", "kind": "Machine", **console_only}]
    try:
        async with (
            replicas(
                tmp_path, backend, config=lambda _: {"endpointPolicy": policy, "parents": parents}
            ) as (fake, servers),
            aiohttp.ClientSession() as http,
        ):
            login: dict[str, bytes | str] = {"ssh-privatekey": ssh.keys.user_private()}
            login["known_hosts"] = ssh.known_hosts()
            fake.secrets["default", "login"] = secret("login", login)
            console = {"endpoint": ssh.url, "sshSecret": "login"}
            await fake.put(machine("vm", status={"console": console}))
            await wait_for(lambda: all(_console(s) == console for s in servers))
            owner, front = owner_and_other(servers)
            statuses = []
            for server in (owner, front):
                async with http.ws_connect(
                    url(server, "console"),
                    protocols=("v5.channel.k8s.io",),
                    **as_user(tmp_path, "alice"),
                ) as ws:
                    statuses.append(await v5_exit_status(ws, b"exit 3\r"))
            code, stderr = await subres_console(tmp_path, front, b"exit 3\r")
        assert statuses[0] == statuses[1]
        assert statuses[1] == exited(3)  # NonZeroExitCode, its ExitCode cause 3
        assert (code, b"exit code 3" in stderr) == (3, True), stderr
        assert len(ssh.connections) == 1  # every session was the owner's, on one connection
    finally:
        await ssh.stop()


async def subres_console(tmp: Path, server: Server, stdin: bytes) -> tuple[int, bytes]:
    """`subres console vm` on `server` as alice (a client certificate), `stdin` piped:
    its exit code and stderr."""
    certs.issue_client(CLIENT_CA, user="alice", groups=[]).write(
        tmp / "alice.crt", tmp / "alice.key"
    )
    cluster = {
        "server": f"https://127.0.0.1:{server.port}",
        "certificate-authority": "certs/ca.crt",
    }
    user = {"client-certificate": "alice.crt", "client-key": "alice.key"}
    kubeconfig = tmp / "alice.kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump({
            "clusters": [{"name": "front", "cluster": cluster}],
            "users": [{"name": "alice", "user": user}],
            "contexts": [{"name": "front", "context": {"cluster": "front", "user": "alice"}}],
            "current-context": "front",
        })
    )  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"} | {"HOME": str(tmp)}
    command = ["console", "vm", "-n", "default"]
    cli = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "subres", "--kubeconfig", str(kubeconfig), *command,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    code, _, stderr = await communicate(cli, stdin, bound=30)
    return code, stderr


def _console(server: Server) -> object:
    vm = server.state.caches["machines"].get("default", "vm")
    return vm and vm["status"].get("console")


async def test_the_sessions_list_is_complete_from_either_replica_with_client_and_bytes(
    tmp_path: Path, backend: Backend
) -> None:
    async with replicas(tmp_path, backend) as (_, servers), aiohttp.ClientSession() as http:
        owner, other = owner_and_other(servers)
        async with (
            http.ws_connect(url(other, "console"), **as_user(tmp_path, "alice")) as writer,
            http.ws_connect(url(owner, "console-observe"), **as_user(tmp_path, "olive")),
        ):
            await echoes(writer, b"12345")
            for asked in (owner, other):
                sessions = url(asked, "sessions").replace("wss://", "https://")
                async with http.get(sessions, **as_user(tmp_path, "bob")) as r:
                    assert "Warning" not in r.headers
                    listing = await r.json()
                found = {(i["user"], i["mode"], i["replica"]) for i in listing["items"]}
                assert found == {
                    ("alice", "writer", other.state.replica),
                    ("olive", "observer", owner.state.replica),
                }
                (alice,) = [i for i in listing["items"] if i["user"] == "alice"]
                assert (alice["bytesUp"], alice["bytesDown"]) == (5, 5)
                assert alice["clientAddress"] == "127.0.0.1"
            # Per namespace too, each replica asked only for what the list shows.
            base = f"https://127.0.0.1:{other.port}/apis/{GROUP_VERSION}/namespaces"
            for namespace, count in (("default", 2), ("elsewhere", 0)):
                async with http.get(
                    f"{base}/{namespace}/sessions", **as_user(tmp_path, "bob")
                ) as r:
                    assert len((await r.json())["items"]) == count


async def test_the_peer_port_admits_only_replica_certificates(
    tmp_path: Path, backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    async with replicas(tmp_path, backend) as (_, servers), aiohttp.ClientSession() as http:
        server = servers[0]
        where = f"https://127.0.0.1:{server.peer_port}/peer/v1/sessions"
        # A user's certificate from the front-proxy CA: the handshake itself fails.
        with pytest.raises(aiohttp.ClientError):
            async with http.get(where, **as_user(tmp_path, "mallory")):
                pass
        # A certificate of the replicas' CA that names no usage: a Status, never a traceback.
        bare = certificate_without_usages(REPLICA_CA, certs.REPLICA_IDENTITY)
        bare.write(tmp_path / "bare.crt", tmp_path / "bare.key")
        with caplog.at_level(logging.WARNING):
            async with http.get(
                where, ssl=replica_ssl(tmp_path, "bare"), server_hostname="subres-replica"
            ) as r:
                assert r.status == 401
                assert (await r.json())["message"] == (
                    "certificate 'subres-replica' names no extended key usage, "
                    "and a replica's says clientAuth"
                )
        assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
        assert any("names no extended key usage" in r.getMessage() for r in caplog.records)
        # The replica certificate gets the listing.
        async with http.get(
            where, ssl=replica_ssl(tmp_path, "replica"), server_hostname="subres-replica"
        ) as r:
            assert r.status == 200
            assert json.loads(await r.text()) == {"items": []}


def replica_ssl(tmp: Path, pair: str) -> ssl.SSLContext:
    """A client context of the replicas' CA with the pair `tmp/pair.crt` and `.key`."""
    ctx = ssl.create_default_context(cafile=str(tmp / "replica-ca.crt"))
    ctx.load_cert_chain(tmp / f"{pair}.crt", tmp / f"{pair}.key")
    return ctx


async def full_frame(ws: aiohttp.ClientWebSocketResponse) -> bytes:
    """An RFB 3.8 viewer's handshake (security None) and one full framebuffer update, as read."""
    got = bytearray()

    async def until(size: int) -> bytes:
        while len(got) < size:
            got.extend(await ws.receive_bytes(timeout=10))
        return bytes(got[:size])

    await until(12)
    await ws.send_bytes(b"RFB 003.008\n")
    await until(14)
    await ws.send_bytes(b"\x01")
    await until(18)
    await ws.send_bytes(b"\x01")
    head = (await until(18 + 24))[18:]
    width, height = struct.unpack(">HH", head[:4])
    (name,) = struct.unpack(">I", head[20:24])
    await ws.send_bytes(b"\x03\x00" + struct.pack(">HHHH", 0, 0, width, height))
    return await until(18 + 24 + name + 16 + width * height * head[4] // 8)


async def test_a_view_only_viewer_on_one_replica_sees_the_display_the_viewer_on_the_other_sees(
    tmp_path: Path,
) -> None:
    display = VncServer(tmp_path / "vnc.sock", display=Display(clock=lambda: "12:00:00"))
    await display.start()
    vnc = await Backend(handler=functools.partial(relay_to_unix, tmp_path / "vnc.sock")).start_tcp()
    try:
        async with replicas(tmp_path, vnc) as (_, servers), aiohttp.ClientSession() as http:
            owner, other = owner_and_other(servers, "vnc")
            async with (
                http.ws_connect(url(owner, "vnc"), **as_user(tmp_path, "alice")) as viewer,
                http.ws_connect(url(other, "vnc-observe"), **as_user(tmp_path, "olive")) as watcher,
            ):
                seen, watched = await asyncio.gather(full_frame(viewer), full_frame(watcher))
        assert len(seen) > 1_000_000  # the whole 640x400 screen
        assert hashlib.sha256(seen).digest() == hashlib.sha256(watched).digest()
    finally:
        await vnc.stop()
        await display.stop()


async def test_while_the_replicas_disagree_on_the_owner_the_client_gets_a_503_before_upgrading(
    tmp_path: Path, backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with replicas(tmp_path, backend) as (_, servers), aiohttp.ClientSession() as http:
        owner, other = owner_and_other(servers)
        # The owner's view (as if its watch had not seen itself yet) says it owns nothing,
        # and stays so for the test.
        monkeypatch.setattr(owner.state.owners, "update", lambda *_, **__: None)
        owner.state.owners.members = (other.state.replica,)
        user = as_user(tmp_path, "alice")
        upgrade = {
            "Connection": "Upgrade",
            "Upgrade": "websocket",
            "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        }
        where = url(other, "console").replace("wss://", "https://")
        async with http.get(where, ssl=user["ssl"], headers=user["headers"] | upgrade) as r:
            status = json.loads(await r.text())
        assert (r.status, status["kind"], status["code"]) == (503, "Status", 503)
        assert status["message"] == (
            "the replicas do not agree yet on who serves the console of default/vm; try again"
        )
        assert backend.accepted == 0
        assert not owner.state.sessions.live and not owner.state.sessions.exclusive


async def test_a_front_that_falls_silent_is_dropped_by_the_owner_and_the_console_freed(
    tmp_path: Path, backend: Backend
) -> None:
    """As a network cut leaves it: a front that asked for heartbeats and sends none."""
    beat = 0.2
    async with replicas(tmp_path, backend) as (_, servers):
        owner, _ = owner_and_other(servers)
        context = ssl.create_default_context(cafile=str(tmp_path / "replica-ca.crt"))
        context.load_cert_chain(tmp_path / "replica.crt", tmp_path / "replica.key")
        who = Who(identity=UserInfo("alice"), client="10.0.0.9", request_id="silent")
        ask = peer.Ask(unit(), Mode.WRITER, who, front="replica-gone")
        stream = await open_relay(
            lambda: PeerStream(owner="owner", high_water=1 << 18, write_timeout=30),
            ("127.0.0.1", owner.peer_port),
            context=context,
            server_name="subres-replica",
            connect_timeout=5,
            request=Request(
                PATH, UPGRADE, "subres-replica", [*peer.headers(ask), (HEARTBEAT, f"{beat:g}")]
            ),
        )
        assert stream.answer[HEARTBEAT.lower()] == f"{beat:g}"
        await wait_for(lambda: backend.open == 1 and bool(owner.state.sessions.exclusive))
        # Never beaten: within four beats the owner lets go of the slot and the console.
        await wait_for(lambda: backend.open == 0 and not owner.state.sessions.exclusive)
        await stream.close()


async def test_a_silent_owner_is_given_up_by_the_front_whose_client_is_told_to_come_back(
    tmp_path: Path, backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a network cut leaves it: an owner that agreed to heartbeats and sends none."""
    beat = 0.2
    # Owners answer `Subres-Heartbeat` but never beat; fronts (relay clients) still do.
    monkeypatch.setattr(UpgradedSocket, "start_heartbeat", lambda *_: None)
    heartbeat = {"session": {"relayHeartbeat": beat}}
    async with (
        replicas(tmp_path, backend, config=lambda _: heartbeat) as (_, servers),
        aiohttp.ClientSession() as http,
    ):
        owner, front = owner_and_other(servers)
        async with http.ws_connect(url(front, "console"), **as_user(tmp_path, "alice")) as ws:
            await echoes(ws, b"up")
            # Idle: within four beats of nothing the front lets go, telling its client why.
            closed = await ws.receive(timeout=20 * beat)
        assert closed.type is aiohttp.WSMsgType.CLOSE
        assert ws.close_code == 1001
        assert (
            closed.extra
            == f"the replica {owner.state.replica} owning this console stopped answering"
        )
        # The owner saw the front's side go and freed the slot and the console.
        await wait_for(lambda: backend.open == 0 and not owner.state.sessions.exclusive)
