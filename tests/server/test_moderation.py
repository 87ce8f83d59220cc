"""Moderated sessions: a writer waits, told so, until a moderator watches; pause, terminate, end.

A policy says that consoles and displays of Machines labelled `env=prod`
need one member of `sre-leads` watching. The writer is bob (a token); the
moderator is mia, whose client certificate says she is in `sre-leads`;
carol may not moderate. The console echoes and keeps what reached it, so a
test sees both what the writer was told and what reached the machine.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import websockets
from websockets.asyncio.client import ClientConnection, connect

from tests.consoles import Console, closed
from tests.server.kubepeer import start_exec
from tests.server.test_console import frame, unframe
from tests.server.test_vnc import vnc_machine
from tests.server.test_vnc_shared import RecordingVnc, Viewer
from tests.support import GROUP_VERSION, Backend, Standalone, machine, start_standalone, wait_for

V5 = "v5.channel.k8s.io"
ENDED, LEFT = 4006, 4007
WAITING = (
    b"\r\n[subres: waiting for 1 moderator (a member of sre-leads) to watch, as policy prod "
    b"requires; what you type is dropped until then]\r\n"
)
STARTS = b"\r\n[subres: mia moderating; the session starts]\r\n"
PAUSED = b"\r\n[subres: paused: waiting for 1 moderator (a member of sre-leads) to watch again]\r\n"
GOES_ON = b"\r\n[subres: mia moderating; the session goes on]\r\n"


def policy(on_leave: str = "pause") -> dict[str, Any]:
    return {
        "moderation": [
            {
                "name": "prod",
                "labels": {"env": "prod"},
                "moderators": {"groups": ["sre-leads"]},
                "onLeave": on_leave,
            }
        ]
    }


def prod(obj: dict[str, Any]) -> dict[str, Any]:
    obj["metadata"]["labels"] = {"env": "prod"}
    return obj


@pytest.fixture
async def subres(tmp_path: Path, serial: Backend) -> AsyncIterator[Standalone]:
    async with start_standalone(
        tmp_path,
        prod(machine("vm1", console=serial.url)),
        machine("dev", console=serial.url),
        config=policy(),
    ) as s:
        yield s


def as_mia(subres: Standalone, url: str, *protocols: str) -> connect:
    """`url` as mia, a member of sre-leads (her client certificate says so)."""
    return connect(
        url,
        ssl=subres.client_cert_ssl("mia", ["sre-leads"]),
        subprotocols=[websockets.Subprotocol(p) for p in protocols] or None,
        compression=None,
        open_timeout=5,
    )


async def stdout(ws: ClientConnection, dialect: str | None, until: bytes) -> bytes:
    """What `ws` printed, up to `until`."""
    seen = b""
    async with asyncio.timeout(10):
        while until not in seen:
            channel, data = unframe(dialect, await ws.recv())
            if channel == 1:
                seen += data
    return seen


async def test_the_writer_waits_told_so_until_a_moderator_watches_and_pauses_when_she_goes(
    subres: Standalone, console: Console
) -> None:
    async with subres.websocket(subres.url("vm1"), V5, user="bob") as bob:
        assert WAITING in await stdout(bob, V5, WAITING)
        await bob.send(b"\x00dropped while waiting\r")
        async with as_mia(subres, subres.url("vm1", "console-moderate"), V5) as mia:
            await stdout(bob, V5, STARTS)
            await bob.send(b"\x00echo watched\r")
            await stdout(mia, V5, b"echo watched\r")  # she sees the writer live
        await stdout(bob, V5, PAUSED)
        await bob.send(b"\x00dropped while paused\r")
        async with as_mia(subres, subres.url("vm1", "console-moderate"), V5):
            await stdout(bob, V5, GOES_ON)
            await bob.send(b"\x00again\r")
            await stdout(bob, V5, b"again\r")
    assert bytes(console.received) == b"echo watched\ragain\r"


async def test_a_moderator_ends_the_session_and_the_audit_names_her(
    subres: Standalone, console: Console
) -> None:
    async with (
        subres.websocket(subres.url("vm1"), V5, user="bob") as bob,
        as_mia(subres, subres.url("vm1", "console-moderate"), V5),
    ):
        await stdout(bob, V5, STARTS)
        mia_tls = subres.client_cert_ssl("mia", ["sre-leads"])
        status, body = await delete(subres, "vm1/console-moderate", tls=mia_tls)
        assert (status, body["message"]) == (
            200,
            "mia ended the moderated console session of Machine default/vm1",
        )
        assert await closed(bob) == (ENDED, "ended by the moderator mia")
    await wait_for(lambda: len([a for a in subres.audit_lines() if a["stage"] == "end"]) == 2)
    (end,) = [a for a in subres.audit_lines() if a["stage"] == "end" and a["user"] == "bob"]
    assert (end["code"], end["moderatedBy"]) == (ENDED, ["mia"])
    moderators = [a for a in subres.audit_lines() if a["mode"] == "moderator"]
    assert {(a["stage"], a["user"]) for a in moderators} == {("start", "mia"), ("end", "mia")}


async def test_when_the_moderator_leaves_terminate_ends_the_session(
    tmp_path: Path, serial: Backend
) -> None:
    async with (
        start_standalone(
            tmp_path, prod(machine("vm1", console=serial.url)), config=policy("terminate")
        ) as subres,
        subres.websocket(subres.url("vm1"), V5, user="bob") as bob,
    ):
        async with as_mia(subres, subres.url("vm1", "console-moderate"), V5):
            await stdout(bob, V5, STARTS)
        assert await closed(bob) == (LEFT, "the moderators left; policy prod ends the session")


@pytest.mark.parametrize("dialect", [None, "plain.kubevirt.io", "v4.channel.k8s.io",
                                     "base64.channel.k8s.io", V5])  # fmt: skip
async def test_a_waiting_writer_reads_why_in_every_dialect(
    subres: Standalone, dialect: str | None
) -> None:
    async with subres.websocket(
        subres.url("vm1"), *([dialect] if dialect else []), user="bob"
    ) as bob:
        assert WAITING in await stdout(bob, dialect, WAITING)
        async with as_mia(subres, subres.url("vm1", "console-moderate"), V5):
            await stdout(bob, dialect, STARTS)
            await bob.send(frame(dialect, 0, b"after\r"))
            await stdout(bob, dialect, b"after\r")


async def test_who_may_moderate_is_decided_before_any_upgrade(subres: Standalone) -> None:
    status, body = await subres.refused(subres.url("vm1", "console-moderate"), V5)
    assert status == 403
    assert body["message"] == (
        "alice may not moderate the console of Machine default/vm1: "
        "its moderators are members of sre-leads"
    )
    with pytest.raises(websockets.InvalidStatus) as refused:
        async with as_mia(subres, subres.url("dev", "console-moderate"), V5):
            pass
    answer = json.loads(refused.value.response.body or b"{}")
    assert answer["message"] == (
        "no moderation policy covers the console of Machine default/dev: "
        "there is nothing to moderate"
    )
    # A console no policy selects is not moderated at all.
    async with subres.websocket(subres.url("dev"), V5, user="bob") as bob:
        await bob.send(b"\x00free\r")
        await stdout(bob, V5, b"free\r")
    status, body = await delete(subres, "vm1/console-moderate", headers=subres.auth)
    assert (status, body["reason"]) == (403, "Forbidden")


async def test_a_moderated_display_waits_for_the_display_until_a_moderator_views(
    tmp_path: Path,
) -> None:
    display = RecordingVnc()
    server = await asyncio.start_server(display.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with (
            start_standalone(
                tmp_path, prod(vnc_machine("vm1", f"tcp://127.0.0.1:{port}")), config=policy()
            ) as subres,
            subres.websocket(subres.url("vm1", "vnc"), "binary", user="bob") as bob,
        ):
            hello = asyncio.create_task(Viewer(bob).hello(shared=True))
            async with as_mia(subres, subres.url("vm1", "vnc-moderate"), "binary") as mia:
                await Viewer(mia).hello(shared=True)
                assert not hello.done(), "the viewer saw the display before a moderator did"
                await hello
                await display.wait(lambda: len(display.inits) == 2)
    finally:
        server.close()


async def test_discovery_lists_the_moderators_subresources(subres: Standalone) -> None:
    url = f"{subres.base}/apis/{GROUP_VERSION}"
    async with (
        aiohttp.ClientSession() as http,
        http.get(url, ssl=subres.client_ssl, headers=subres.auth) as r,
    ):
        listing = await r.json()
    verbs = {r["name"]: r["verbs"] for r in listing["resources"]}
    assert verbs["machines/console-moderate"] == ["create", "delete", "get"]
    assert verbs["machines/vnc-moderate"] == ["delete", "get"]


async def delete(
    subres: Standalone,
    path: str,
    *,
    tls: ssl.SSLContext | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, Any]]:
    url = f"{subres.base}/apis/{GROUP_VERSION}/namespaces/default/machines/{path}"
    async with (
        aiohttp.ClientSession() as http,
        http.delete(url, ssl=tls or subres.client_ssl, headers=headers) as r,
    ):
        return r.status, await r.json()


async def test_a_waiting_writer_over_spdy_reads_why_too(
    subres: Standalone, console: Console, kubepeer_bin: Path
) -> None:
    peer = await start_exec(kubepeer_bin, subres, "vm1", transport="spdy")
    assert peer.stdin is not None and peer.stdout is not None
    try:
        async with asyncio.timeout(10):
            assert await peer.stdout.readexactly(len(WAITING)) == WAITING
        async with as_mia(subres, subres.url("vm1", "console-moderate"), V5):
            async with asyncio.timeout(10):
                assert await peer.stdout.readexactly(len(STARTS)) == STARTS
            peer.stdin.write(b"typed over spdy\n")
            await peer.stdin.drain()
            async with asyncio.timeout(10):
                assert await peer.stdout.readexactly(16) == b"typed over spdy\n"
    finally:
        peer.kill()
        await peer.wait()
    assert bytes(console.received) == b"typed over spdy\n"
