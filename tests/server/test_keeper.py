"""The console keeper: one connection kept while nobody is attached, its scrollback replayed.

The backend is a console that counts its connections, echoes input, and
prints whatever the test tells it to while nobody is attached.
"""

from __future__ import annotations

import asyncio
import collections
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from subres.server.app import KEEPER
from tests.consoles import Console, closed, stdout_until
from tests.support import Backend, Standalone, machine, start_standalone, wait_for

V5 = "v5.channel.k8s.io"
TIMEOUT = 10.0
KEEP = {"subres.dev/keep-console": "true"}


def kept(name: str, url: str, *, phase: str = "Running") -> dict[str, Any]:
    return machine(name, console=url, phase=phase, annotations=KEEP)


@pytest.fixture
async def subres(tmp_path: Path, serial: Backend) -> AsyncIterator[Standalone]:
    async with start_standalone(
        tmp_path,
        kept("vm1", serial.url),
        kept("stopped", serial.url, phase="Stopped"),
        machine("plain", console=serial.url),
        config={"consoles": {"scrollback": 4096}},
    ) as s:
        yield s


def console_url(subres: Standalone, sub: str = "console", query: str = "") -> str:
    return subres.url("vm1", sub) + query


async def test_a_line_printed_while_nobody_is_attached_is_replayed_on_attach(
    subres: Standalone, serial: Backend, console: Console
) -> None:
    await serial.wait_open(1)  # kept at start, with nobody attached
    await console.say(b"login: booted at 10:02\r\n")
    async with subres.websocket(console_url(subres), V5) as ws:
        assert b"login: booted at 10:02\r\n" in await stdout_until(ws, b"10:02\r\n")
        await ws.send(b"\x00whoami\r\n")
        await stdout_until(ws, b"whoami\r\n")
    # The kept connection outlived the session, and the next one replays both.
    await serial.wait_open(1)
    async with subres.websocket(console_url(subres, "console-observe"), V5, user="bob") as ws:
        replay = await stdout_until(ws, b"whoami\r\n")
        assert replay == b"login: booted at 10:02\r\nwhoami\r\n"
    async with subres.websocket(console_url(subres, query="?tail=1"), V5) as ws:
        assert await stdout_until(ws, b"whoami\r\n") == b"whoami\r\n"
    assert serial.accepted == 1


async def test_only_running_parents_that_opt_in_are_kept(
    subres: Standalone, serial: Backend
) -> None:
    await serial.wait_open(1)
    keeper = subres.server.runner.app[KEEPER]  # type: ignore[union-attr]
    assert [key.name for key in keeper.consoles] == ["vm1"]
    async with subres.websocket(subres.url("plain"), V5) as ws:
        await ws.recv()
        await serial.wait_open(2)  # its own connection, for as long as the session lives
    await serial.wait_open(1)


async def test_the_writer_and_observers_share_the_kept_connection_through_a_takeover(
    subres: Standalone, serial: Backend
) -> None:
    await serial.wait_open(1)
    async with (
        subres.websocket(console_url(subres, "console-observe"), V5, user="carol") as carol,
        subres.websocket(console_url(subres), V5) as alice,
    ):
        await alice.send(b"\x00one\r\n")
        await stdout_until(carol, b"one\r\n")
        async with subres.websocket(console_url(subres), V5, user="bob") as bob:
            assert (await closed(alice))[0] == 4001
            await bob.send(b"\x00two\r\n")
            assert b"two\r\n" in await stdout_until(bob, b"two\r\n")
            await stdout_until(carol, b"two\r\n")
    assert serial.accepted == 1


async def test_the_writers_end_of_input_ends_the_console_and_it_is_dialed_again(
    subres: Standalone, serial: Backend
) -> None:
    await serial.wait_open(1)
    async with subres.websocket(console_url(subres), V5) as ws:
        await ws.recv()
        await ws.send(bytes((255, 0)))  # v5: stdin closed; the console half-closes back
        async with asyncio.timeout(TIMEOUT):
            messages = [m async for m in ws]
        assert isinstance(messages[-1], bytes) and b'"Success"' in messages[-1]
    async with asyncio.timeout(TIMEOUT), serial.changed:
        await serial.changed.wait_for(lambda: serial.accepted == 2 and serial.open == 1)


async def test_a_parent_that_stops_opting_in_is_let_go(subres: Standalone, serial: Backend) -> None:
    await serial.wait_open(1)
    async with subres.websocket(console_url(subres, "console-observe"), V5, user="bob") as bob:
        await bob.recv()
        subres.write_machines(machine("vm1", console=serial.url))
        await serial.wait_open(0)
        async with asyncio.timeout(TIMEOUT):
            assert [m async for m in bob][-1][:1] == b"\x03"  # the console ended: a Status
    assert bob.close_code == 1000
    subres.write_machines(kept("vm1", serial.url))
    await serial.wait_open(1)


async def test_a_kept_console_that_cannot_be_reached_says_why(tmp_path: Path) -> None:
    async with start_standalone(tmp_path, kept("vm1", "tcp://127.0.0.1:1")) as subres:
        status, body = await subres.refused(console_url(subres), V5)
    assert status == 503
    assert body["message"].startswith("Machine default/vm1: the kept console is not connected")


async def test_consoles_kept_always_and_at_most_max_kept(tmp_path: Path, serial: Backend) -> None:
    always = {
        "parents": [
            {
                "resource": "machines",
                "kind": "Machine",
                "source": {"group": "subres.dev", "version": "v1alpha1"},
                "subresources": {
                    "console": {"endpoint": ".status.console.endpoint", "keep": "always"}
                },
            }
        ],
        "consoles": {"maxKept": 2},
    }
    machines = [machine(f"vm{i}", console=serial.url) for i in range(3)]
    async with start_standalone(tmp_path, *machines, config=always) as subres:
        await serial.wait_open(2)
        await wait_for(lambda: len(subres.server.state.sessions.hubs) == 2)
        assert sorted(k.name for k in subres.server.state.sessions.hubs) == ["vm0", "vm1"]
    await serial.wait_open(0)


async def test_kept_places_are_shared_fairly_between_namespaces(
    tmp_path: Path, serial: Backend
) -> None:
    # One namespace annotates many consoles, others a few: each still gets its share.
    objects = [kept(f"vm{i:02}", serial.url) for i in range(12)]
    for namespace in ("team-a", "team-b"):
        for i in range(2):
            obj = kept(f"{namespace}-{i}", serial.url)
            obj["metadata"]["namespace"] = namespace
            objects.append(obj)
    config = {"consoles": {"maxKept": 8, "maxKeptPerNamespace": 5}}
    async with start_standalone(tmp_path, *objects, config=config) as subres:
        await serial.wait_open(8)
        hubs = subres.server.state.sessions.hubs
        await wait_for(lambda: len(hubs) == 8)
        per_namespace = collections.Counter(key.namespace for key in hubs)
        assert per_namespace == {"default": 4, "team-a": 2, "team-b": 2}
    config = {"consoles": {"maxKept": 100, "maxKeptPerNamespace": 5}}
    async with start_standalone(tmp_path, *objects, config=config) as subres:
        await serial.wait_open(9)
        hubs = subres.server.state.sessions.hubs
        await wait_for(lambda: len(hubs) == 9)
        assert collections.Counter(key.namespace for key in hubs)["default"] == 5


async def test_a_kept_place_goes_only_to_a_console_that_names_an_endpoint(
    tmp_path: Path, serial: Backend
) -> None:
    # First in name order, opted in and Running, but its console names no endpoint (yet).
    bare = machine("a-bare", annotations=KEEP)
    async with start_standalone(
        tmp_path, bare, kept("b", serial.url), config={"consoles": {"maxKept": 1}}
    ) as subres:
        await serial.wait_open(1)
        hubs = subres.server.state.sessions.hubs
        await wait_for(lambda: [k.name for k in hubs] == ["b"])
        status, _, body = await subres.fetch(subres.url("b", "log", scheme="https"))
        assert status == 200, body
        status, _, body = await subres.fetch(subres.url("a-bare", "log", scheme="https"))
        assert status == 400, body
        assert json.loads(body)["message"] == (
            "Machine default/a-bare: the console is not kept, so it has no log: "
            "it names no endpoint to dial (.status.console.endpoint)"
        )
