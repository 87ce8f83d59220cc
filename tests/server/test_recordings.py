"""Recorded consoles: everyone is told, the file holds what they saw, the API serves it.

The files are parsed back as asciicast v2; they are read through the API
(`…/recordings`), as a user would, and their caps rotate and prune them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from subres.protocol import asciicast
from subres.sessions import recordings as recordings_module
from subres.sessions.recordings import BANNER
from tests.consoles import stdout_until
from tests.support import GROUP_VERSION, Backend, Standalone, machine, start_standalone, wait_for

V5 = "v5.channel.k8s.io"
TIMEOUT = 10.0
RECORD = {"subres.dev/record-console": "true"}


def recorded(name: str, url: str) -> dict[str, Any]:
    return machine(name, console=url, annotations=RECORD)


def settings(tmp: Path, **files: int) -> dict[str, Any]:
    return {"consoles": {"recordings": {"directory": str(tmp / "recordings"), **files}}}


@pytest.fixture
async def subres(tmp_path: Path, backend: Backend) -> AsyncIterator[Standalone]:
    async with start_standalone(
        tmp_path,
        recorded("vm1", backend.url),
        machine("plain", console=backend.url),
        config=settings(tmp_path),
    ) as s:
        yield s


async def api(subres: Standalone, path: str) -> tuple[int, str, bytes]:
    url = f"{subres.base}/apis/{GROUP_VERSION}/namespaces/default/machines/{path}"
    async with (
        aiohttp.ClientSession() as http,
        http.get(url, ssl=subres.client_ssl, headers=subres.auth) as r,
    ):
        return r.status, r.content_type, await r.read()


async def recordings(subres: Standalone, name: str = "vm1") -> list[dict[str, Any]]:
    status, _, body = await api(subres, f"{name}/recordings")
    assert status == 200
    items: list[dict[str, Any]] = json.loads(body)["items"]
    return items


async def test_a_recorded_session_is_announced_and_replays_what_everyone_saw(
    subres: Standalone,
) -> None:
    async with (
        subres.websocket(subres.url("vm1"), V5) as alice,
        subres.websocket(subres.url("vm1", "console-observe"), V5, user="bob") as bob,
    ):
        assert await stdout_until(alice, BANNER) == BANNER
        assert await stdout_until(bob, BANNER) == BANNER
        await alice.send(b"\x04" + json.dumps({"Width": 100, "Height": 30}).encode())
        await alice.send(b"\x00echo recorded \xe2\x82\xac\r\n")
        await stdout_until(bob, "recorded €\r\n".encode())
    await wait_for(lambda: not subres.server.state.sessions.live)
    await subres.server.state.recordings.stop()  # written now, not at the next flush
    (item,) = await recordings(subres)
    assert item["title"] == "Machine default/vm1 console" and item["size"] > 0
    status, content_type, body = await api(subres, f"vm1/recordings/{item['name']}")
    assert (status, content_type) == (200, "application/x-asciicast")
    header, events = asciicast.read(body.splitlines())
    assert (header.width, header.height) == (80, 24)
    seen = [(e.code, e.data) for e in events]
    assert ("r", "100x30") in seen
    assert "".join(data for code, data in seen if code == "o") == "echo recorded €\r\n"
    markers = [data for code, data in seen if code == "m"]
    assert markers == [
        "alice (writer) attached",
        "bob (observer) attached",
        "bob (observer) left",
        "alice (writer) left",
    ]
    audit = [line for line in subres.audit_lines() if line["stage"] == "end"]
    assert all(line["user"] in ("alice", "bob") for line in audit)


async def test_a_console_that_does_not_opt_in_is_not_recorded_nor_announced(
    subres: Standalone,
) -> None:
    async with subres.websocket(subres.url("plain"), V5) as ws:
        assert await asyncio.wait_for(ws.recv(), TIMEOUT) == b"\x01"  # the hello, no banner
        await ws.send(b"\x00hi")
        assert await asyncio.wait_for(ws.recv(), TIMEOUT) == b"\x01hi"
    assert await recordings(subres, "plain") == []


async def test_recordings_are_only_read_by_their_names(subres: Standalone) -> None:
    for path in ("vm1/recordings/..%2F..%2Ftokens.csv", "vm1/recordings/notes.txt"):
        status, _, body = await api(subres, path)
        assert status == 404 and json.loads(body)["kind"] == "Status"


async def test_a_long_recording_goes_on_in_parts_and_old_ones_are_deleted(
    tmp_path: Path, backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(recordings_module, "QUIET", 0.0)  # no other replica shares the files
    caps = settings(tmp_path, maxFileBytes=2000, maxNamespaceBytes=6000)
    async with start_standalone(tmp_path, recorded("vm1", backend.url), config=caps) as subres:
        for round_ in range(4):
            async with subres.websocket(subres.url("vm1"), V5) as ws:
                for line in range(10):
                    text = f"round {round_} line {line} {'x' * 300}\r\n".encode()
                    await ws.send(b"\x00" + text)
                    await stdout_until(ws, text)
            await wait_for(lambda: not subres.server.state.sessions.live)
            await subres.server.state.recordings.stop()
        files = sorted((tmp_path / "recordings" / "default" / "machines").glob("vm1/*/*.cast"))
        total = sum(f.stat().st_size for f in files)
        assert total <= 6000
        assert any(f.name.endswith(".2.cast") for f in files)
        for f in files:  # every part plays on its own
            _, events = asciicast.read(f.read_bytes().splitlines())
            list(events)
        listed = await recordings(subres)
        assert {i["name"] for i in listed} == {f.name for f in files}


async def test_a_takeover_is_marked_with_who_took_over_from_whom(subres: Standalone) -> None:
    async with subres.websocket(subres.url("vm1"), V5) as alice:
        await stdout_until(alice, BANNER)
        async with subres.websocket(subres.url("vm1"), V5, user="bob") as bob:
            await stdout_until(bob, BANNER)
            await wait_for(lambda: len(subres.server.state.sessions.live) == 1)
    await wait_for(lambda: not subres.server.state.sessions.live)
    (item,) = await recordings(subres)
    _, _, body = await api(subres, f"vm1/recordings/{item['name']}")
    _, events = asciicast.read(body.splitlines())
    markers = [e.data for e in events if e.code == "m"]
    assert markers == [
        "alice (writer) attached",
        "bob (writer) attached",
        "bob took over from alice",
        "alice (writer) left",
        "bob (writer) left",
    ]
