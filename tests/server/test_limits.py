"""Per-role limits: the strictest rule that selects a session ends it, or refuses it, saying which.

Sessions end with their own close code (4004 for the maximum duration, 4005
for idleness) and the rule's name, which the client, the audit line and the
Event all carry; a user past `maxSessionsPerUser` gets 429 before any
upgrade. The upgrade's answer tells a client what is in force.
"""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import websockets
import yaml
from websockets.asyncio.client import ClientConnection

from subres.policies import Limits, PolicyError, parse_limits
from subres.server import usbredir
from tests.consoles import closed, stdout_until
from tests.server.replicas import as_user, owner_and_other, replicas, url
from tests.server.test_audit_events import with_uid
from tests.server.test_cluster import client_ssl, cluster
from tests.server.test_replicas_units import answer, put_vm, tagged_backends
from tests.server.test_vnc import vnc_machine
from tests.server.test_vnc_shared import RecordingVnc, Viewer
from tests.support import LOOPBACK_POLICY, Backend, Standalone, machine, start_standalone, wait_for

V5 = "v5.channel.k8s.io"
MAX_DURATION, IDLE = 4004, 4005
UPDATE_REQUEST = b"\x03\x01" + struct.pack(">HHHH", 0, 0, 64, 48)


def limits(*rules: dict[str, Any]) -> dict[str, Any]:
    return {"limits": list(rules)}


async def end_of(subres: Standalone, user: str) -> dict[str, Any]:
    """`user`'s audit end line (written by a thread of its own: it may come a moment later)."""

    def ends() -> list[dict[str, Any]]:
        return [a for a in subres.audit_lines() if a["stage"] == "end" and a["user"] == user]

    await wait_for(lambda: bool(ends()))
    (line,) = ends()
    return line


async def test_a_session_ends_at_its_maximum_duration_and_says_why(
    tmp_path: Path, serial: Backend
) -> None:
    rule = {"name": "short", "users": ["alice"], "maxSessionDuration": "1s"}
    async with (
        start_standalone(tmp_path, machine("vm1", console=serial.url), config=limits(rule)) as s,
        s.websocket(s.url("vm1"), V5) as ws,
    ):
        assert ws.response is not None
        assert ws.response.headers["Subres-Session-Seconds-Left"] == "1"
        code, reason = await closed(ws)
    assert (code, reason) == (
        MAX_DURATION,
        "the session reached its maximum duration of 1s (limit short)",
    )
    end = await end_of(s, "alice")
    assert (end["code"], end["reason"]) == (code, reason)


async def test_the_strictest_rule_wins(tmp_path: Path, serial: Backend) -> None:
    everyone = {"name": "everyone", "maxSessionDuration": "1h", "idleTimeout": 3600}
    devs = {"name": "devs", "groups": ["devs"], "subresources": ["console"], "idleTimeout": 1}
    other = {"name": "vnc-only", "subresources": ["vnc"], "maxSessionDuration": 1}
    config = limits(everyone, devs, other)
    async with (
        start_standalone(tmp_path, machine("vm1", console=serial.url), config=config) as s,
        s.websocket(s.url("vm1"), V5) as ws,
    ):
        assert ws.response is not None
        assert ws.response.headers["Subres-Session-Seconds-Left"] == "3600"
        assert ws.response.headers["Subres-Idle-Timeout"] == "1"
        code, reason = await closed(ws)
    assert (code, reason) == (IDLE, "no input for 1s: the session's idle timeout (limit devs)")


async def test_input_keeps_a_console_alive_and_observers_are_never_idle(
    tmp_path: Path, serial: Backend
) -> None:
    rule = {"name": "idle", "idleTimeout": 1}
    async with (
        start_standalone(tmp_path, machine("vm1", console=serial.url), config=limits(rule)) as s,
        s.websocket(s.url("vm1"), V5) as alice,
        s.websocket(s.url("vm1", "console-observe"), V5, user="bob") as bob,
    ):
        for number in range(5):  # two seconds of typing, past the idle timeout
            await alice.send(b"\x00" + f"key {number}\r\n".encode())
            await stdout_until(alice, f"key {number}\r\n".encode())
            await asyncio.sleep(0.4)  # a person's pace at the keyboard
        assert (await closed(alice))[0] == IDLE
        # The observer watched through all of it and outlives the writer.
        async with s.websocket(s.url("vm1"), V5, user="carol") as carol:
            await carol.send(b"\x00still watched\r\n")
            await stdout_until(bob, b"still watched\r\n")


async def test_a_user_past_max_sessions_is_refused_before_any_upgrade(
    tmp_path: Path, serial: Backend
) -> None:
    rule = {
        "name": "one-each",
        "users": ["alice"],
        "subresources": ["console", "console-observe"],
        "maxSessionsPerUser": 1,
    }
    async with (
        start_standalone(tmp_path, machine("vm1", console=serial.url), config=limits(rule)) as s,
        s.websocket(s.url("vm1"), V5) as alice,
    ):
        await alice.recv()
        status, body = await s.refused(s.url("vm1", "console-observe"), V5)
        assert (status, body["reason"]) == (429, "TooManyRequests")
        assert body["message"] == (
            "alice already has 1 console, console-observe sessions open, the most the "
            "limit one-each allows; close one first"
        )
        async with s.websocket(s.url("vm1", "console-observe"), V5, user="bob") as bob:
            await bob.recv()
        assert len(s.server.state.sessions.live) == 1


async def test_a_viewers_update_requests_are_not_input(tmp_path: Path) -> None:
    display = RecordingVnc()
    server = await asyncio.start_server(display.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    rule = {"name": "idle", "subresources": ["vnc"], "idleTimeout": 1}
    try:
        async with (
            start_standalone(
                tmp_path, vnc_machine("vm1", f"tcp://127.0.0.1:{port}"), config=limits(rule)
            ) as s,
            s.websocket(s.url("vm1", "vnc"), "binary") as ws,
        ):
            await Viewer(ws).hello(shared=True)
            asking = asyncio.create_task(ask_for_updates(ws))
            try:
                code, reason = await closed(ws)
            finally:
                asking.cancel()
                await asyncio.wait([asking])
    finally:
        server.close()
    assert (code, reason) == (IDLE, "no input for 1s: the session's idle timeout (limit idle)")


async def ask_for_updates(ws: ClientConnection) -> None:
    """What a viewer sends while its user does nothing: update requests, on and on."""
    while True:
        await ws.send(UPDATE_REQUEST)
        await asyncio.sleep(0.2)  # a viewer's pace


async def test_events_carry_the_limits_reason(tmp_path: Path, backend: Backend) -> None:
    settings = {"endpointPolicy": LOOPBACK_POLICY, **limits({"name": "t", "idleTimeout": 1})}
    (tmp_path / "limits.yaml").write_text(yaml.safe_dump(settings))
    async with cluster(tmp_path, config=tmp_path / "limits.yaml") as (fake, server):
        fake.allow = lambda spec: True
        await fake.put(with_uid(machine("vm", console=backend.url), "uid-vm"))
        await wait_for(lambda: server.state.caches["machines"].get("default", "vm") is not None)
        url = f"wss://127.0.0.1:{server.port}/apis/subresources.subres.dev/v1alpha1"
        url += "/namespaces/default/machines/vm/console"
        async with websockets.connect(
            url,
            ssl=client_ssl(tmp_path),
            additional_headers={"Authorization": "Bearer alice-token"},
            subprotocols=[websockets.Subprotocol(V5)],
        ) as ws:
            assert (await closed(ws))[0] == IDLE
        await fake.wait(lambda: len(fake.events) == 2)
    assert fake.events[1]["message"].endswith(
        ": no input for 1s: the session's idle timeout (limit t)"
    )


def test_rules_are_read_strictly() -> None:
    (rule,) = parse_limits([{"groups": ["devs"], "maxSessionDuration": "1h30m"}])
    assert (rule.name, rule.max_session_duration) == ("limits[0]", 5400.0)
    for bad, message in [
        ([{"name": "x"}], "sets no limit"),
        ([{"idleTimeout": "soon"}], "seconds or a duration"),
        ([{"idleTimeout": -1}], "positive duration"),
        ([{"maxSessionsPerUser": 0}], "positive integer"),
        ([{"idleTimeout": 1, "user": ["x"]}], r"unknown keys \['user'\]"),
    ]:
        with pytest.raises(PolicyError, match=message):
            parse_limits(bad)
    limits_of = Limits.of(
        parse_limits([{"idleTimeout": 60}, {"users": ["bob"], "idleTimeout": 5}]),
        user="alice",
        groups=["devs"],
        subresource="console",
    )
    assert limits_of.idle is not None and limits_of.idle.value == 60


@pytest.mark.parametrize(
    ("dialect", "reached"),
    [
        pytest.param(dialect, reached, id=f"usbredir-{dialect or 'raw'}-{reached}-ends-idle")
        for dialect in usbredir.SUBPROTOCOLS
        for reached in ("owner", "relayed")
    ],
)
async def test_a_usb_redirection_without_input_ends_at_its_idle_timeout(
    tmp_path: Path, backend: Backend, dialect: str, reached: str
) -> None:
    rule = {"name": "idle", "subresources": ["usbredir"], "idleTimeout": 1}
    async with (
        tagged_backends(b"slot0:") as slots,
        replicas(tmp_path, backend, config=lambda _: limits(rule)) as (fake, servers),
        aiohttp.ClientSession() as http,
    ):
        await put_vm(fake, servers, {"usbredir": {"endpoints": [b.url for b in slots]}})
        owner, other = owner_and_other(servers, "usbredir")
        front = owner if reached == "owner" else other
        async with http.ws_connect(
            url(front, "usbredir"),
            protocols=(dialect,) if dialect else (),
            **as_user(tmp_path, "alice"),
        ) as ws:
            assert await answer(ws, b"hello") == b"slot0:hello"
            closing = await ws.receive(timeout=10)
    assert (closing.type, closing.data, closing.extra) == (
        aiohttp.WSMsgType.CLOSE,
        IDLE,
        "no input for 1s: the session's idle timeout (limit idle)",
    )
