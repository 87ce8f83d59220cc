"""Sessions that last: relayed and local sessions outlive every timer the product ships.

Two real cluster-mode replicas (`tests.server.replicas`) with the shipped
defaults (connection timeouts, pings, relay heartbeats, membership Lease
duration and renewal, webhook cache TTLs). Through replica A: a console and
a VNC session whose owner is B (relayed over the peer port) and a console
and a VNC session A owns itself; a KubeVirt-style port-forward through each
replica (port-forward has no owner: the replica asked serves it). Each is
exercised with bytes both ways, hashed, for longer than the largest of those
timers, and none may close or be reaped.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import os
import time
from pathlib import Path

import aiohttp

from subres.config.model import SessionSpec
from subres.protocol.relay import MISSED_BEATS
from subres.server.options import Options
from subres.server.run import Server
from subres.serving.connections import Limits
from subres.sessions.members import rendezvous
from subres.sessions.registry import SessionKey
from tests.server.replicas import PATH, as_user, replicas
from tests.support import Backend, machine, wait_for

_SESSION = SessionSpec()
_OPTIONS: dict[str, float] = {
    f.name: f.default for f in dataclasses.fields(Options) if isinstance(f.default, float)
}
SHIPPED_TIMERS = {
    "--tls-handshake-timeout": Limits().tls_handshake_timeout,
    "--request-header-timeout": Limits().request_header_timeout,
    "--idle-timeout": Limits().idle_timeout,
    "session.pingInterval": _SESSION.ping_interval,
    "session.relayHeartbeat (missed beats)": _SESSION.relay_heartbeat * MISSED_BEATS,
    "session.connectTimeout": _SESSION.connect_timeout,
    "session.backendWriteTimeout": _SESSION.backend_write_timeout,
    "session.sshIdleTimeout": _SESSION.ssh_idle_timeout,
    "--member-duration": _OPTIONS["member_duration"],
    "--member-renew": _OPTIONS["member_renew"],
    "--authentication-token-webhook-cache-ttl": _OPTIONS["authentication_token_webhook_cache_ttl"],
    "--authorization-webhook-cache-authorized-ttl": _OPTIONS[
        "authorization_webhook_cache_authorized_ttl"
    ],
}
"""Every timer a connection or session meets by default; none of them may end a session."""
LASTING_S = max(SHIPPED_TIMERS.values()) + 5.0
"""How long the sessions are kept open and exercised."""
PACE_S = 2.0
"""Seconds between exchanges on one session: quiet in between, as a user's typing is."""
NAMES = tuple(f"vm{i}" for i in range(12))


@dataclasses.dataclass
class Exercised:
    """One session, its bytes each way hashed."""

    label: str
    sent: hashlib._Hash = dataclasses.field(default_factory=hashlib.sha256)
    got: hashlib._Hash = dataclasses.field(default_factory=hashlib.sha256)
    exchanges: int = 0
    lived_s: float = 0.0


async def test_relayed_and_local_sessions_outlive_every_shipped_timer(
    tmp_path: Path, backend: Backend
) -> None:
    async with (
        replicas(
            tmp_path,
            backend,
            member_duration=_OPTIONS["member_duration"],
            member_renew=_OPTIONS["member_renew"],
        ) as (fake, servers),
        aiohttp.ClientSession() as http,
    ):
        front, other = servers
        port = int(backend.url.rsplit(":", 1)[1])
        for name in NAMES:
            vm = machine(name, console=backend.url)
            vm["status"]["vnc"] = {"endpoint": backend.url}
            vm["status"]["portForward"] = {"address": "127.0.0.1", "ports": [port]}
            await fake.put(vm)
        await wait_for(
            lambda: all(
                s.state.caches["machines"].get("default", n) for s in servers for n in NAMES
            )
        )
        plan = {
            "console relayed (owner B)": (front, _owned_by(other, "console"), "console"),
            "console local (owner A)": (front, _owned_by(front, "console"), "console"),
            "vnc relayed (owner B)": (front, _owned_by(other, "vnc"), "vnc"),
            "vnc local (owner A)": (front, _owned_by(front, "vnc"), "vnc"),
            "portforward through A": (front, NAMES[0], f"portforward/{port}"),
            "portforward through B": (other, NAMES[0], f"portforward/{port}"),
        }
        sockets = {
            label: await http.ws_connect(
                f"wss://127.0.0.1:{server.port}{PATH.replace('/vm/', f'/{name}/')}{sub}",
                **as_user(tmp_path, "alice"),
            )
            for label, (server, name, sub) in plan.items()
        }
        results = await asyncio.gather(*(_exercise(label, ws) for label, ws in sockets.items()))
        for ws in sockets.values():
            await ws.close()
        reaped = {s.state.replica: dict(s.state.connections.reaped) for s in servers}
    for result in results:
        print(
            f"  {result.label}: lived {result.lived_s:.1f} s, {result.exchanges} exchanges, "
            f"sha256 up {result.sent.hexdigest()[:12]}, down {result.got.hexdigest()[:12]}"
        )
        assert result.lived_s > LASTING_S - PACE_S
        assert result.sent.hexdigest() == result.got.hexdigest(), result.label
    # No connection of either port was closed by a timer.
    assert not any(reaped.values()), reaped


def _owned_by(server: Server, sub: str) -> str:
    """A machine whose `sub` unit `server` owns."""
    members = server.state.owners.members
    return next(
        name
        for name in NAMES
        if rendezvous(SessionKey("machines", sub, "default", name), members) == server.state.replica
    )


async def _exercise(label: str, ws: aiohttp.ClientWebSocketResponse) -> Exercised:
    """Echo random bytes through `ws` every `PACE_S` until `LASTING_S` passed; fail at any close."""
    done = Exercised(label)
    start = time.monotonic()
    while done.lived_s < LASTING_S:
        data = os.urandom(1 + done.exchanges % 4096)
        await ws.send_bytes(data)
        done.sent.update(data)
        got = 0
        while got < len(data):
            message = await ws.receive(timeout=10)
            assert message.type is aiohttp.WSMsgType.BINARY, (
                f"{label} ended after {time.monotonic() - start:.1f} s: {message}"
            )
            done.got.update(message.data)
            got += len(message.data)
        done.exchanges += 1
        await asyncio.sleep(PACE_S)  # pacing, as a user types: the quiet is under test
        done.lived_s = time.monotonic() - start
    return done
