"""Several consoles per machine: each picked by `?console=NAME`, each a unit of its own.

The machine kind names two consoles, `serial0` (the default, what a request
without `console` opens) and `serial1`; each is an echo backend that tags what
it sends back, so every byte a client gets says which console it came from.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection

from tests.consoles import stdout_until
from tests.server.kubepeer import start_exec
from tests.support import Backend, Standalone, machine, start_standalone, wait_for

V5 = "v5.channel.k8s.io"
TIMEOUT = 10.0
KEEP = {"subres.dev/keep-console": "true", "subres.dev/record-console": "true"}
RUNNING = {".status.phase": ["Running"]}
TWO_CONSOLES = {
    "parents": [
        {
            "resource": "machines",
            "kind": "Machine",
            "source": {"group": "subres.dev", "version": "v1alpha1", "resource": "machines"},
            "subresources": {
                "console": {
                    "endpoint": ".status.console.endpoint",
                    "require": RUNNING,
                    "consoles": {"serial1": {"endpoint": ".status.consoles.serial1.endpoint"}},
                }
            },
        }
    ]
}


def tagged(tag: bytes) -> Any:
    """An echo console that says which it is: `tag` before every chunk it sends back."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(tag + data)
            await writer.drain()

    return handle


@pytest.fixture
async def serials() -> AsyncIterator[tuple[Backend, Backend]]:
    zero = await Backend(handler=tagged(b"[ttyS0]")).start_tcp()
    one = await Backend(handler=tagged(b"[ttyS1]")).start_tcp()
    yield zero, one
    await asyncio.gather(zero.stop(), one.stop())


def two(name: str, serials: tuple[Backend, Backend], **extra: Any) -> dict[str, Any]:
    status = {"consoles": {"serial1": {"endpoint": serials[1].url}}}
    return machine(name, console=serials[0].url, status=status, **extra)


@pytest.fixture
async def subres(tmp_path: Path, serials: tuple[Backend, Backend]) -> AsyncIterator[Standalone]:
    recordings = {"recordings": {"directory": str(tmp_path / "recordings")}}
    async with start_standalone(
        tmp_path,
        two("vm1", serials),
        two("kept", serials, annotations=KEEP),
        config={**TWO_CONSOLES, "consoles": recordings},
    ) as s:
        yield s


def url(subres: Standalone, name: str, sub: str = "console", console: str = "") -> str:
    return subres.url(name, sub) + (f"?console={console}" if console else "")


async def typed(ws: ClientConnection, text: bytes, tag: bytes) -> None:
    await ws.send(b"\x00" + text)
    assert (await stdout_until(ws, tag + text)).endswith(tag + text)


async def test_each_console_has_its_own_writer_and_observers(
    subres: Standalone, serials: tuple[Backend, Backend]
) -> None:
    async with (
        subres.websocket(url(subres, "vm1"), V5) as zero,
        subres.websocket(url(subres, "vm1", console="serial1"), V5, user="bob") as one,
        subres.websocket(
            url(subres, "vm1", "console-observe", "serial1"), V5, user="carol"
        ) as watcher,
    ):
        # Two writers at once, one per console: neither takes the other over.
        await typed(zero, b"on zero\n", b"[ttyS0]")
        await typed(one, b"on one\n", b"[ttyS1]")
        assert await stdout_until(watcher, b"[ttyS1]on one\n") == b"[ttyS1]on one\n"
        listing = await get_json(subres, subres.url("vm1", "sessions", scheme="https"))
        held = sorted((i["user"], i["unit"], i["mode"]) for i in listing["items"])
        assert held == [
            ("alice", "serial0", "writer"),
            ("bob", "serial1", "writer"),
            ("carol", "serial1", "observer"),
        ]
        assert listing["consoles"] == ["serial0", "serial1"]
        # serial0 by name is the default console: this takes alice's place, not bob's.
        async with subres.websocket(url(subres, "vm1", console="serial0"), V5, user="carol"):
            async with asyncio.timeout(TIMEOUT):
                await zero.wait_closed()
            assert (zero.close_code, zero.close_reason) == (
                4001,
                "console of default/vm1 taken over by carol",
            )
            await typed(one, b"still\n", b"[ttyS1]")
    # One connection each is the keeper's, of the machine `kept`.
    assert [s.accepted for s in serials] == [3, 2]


async def test_an_unknown_console_is_refused_naming_the_known_ones(
    subres: Standalone, serials: tuple[Backend, Backend]
) -> None:
    await wait_for(lambda: [s.open for s in serials] == [1, 1])  # `kept`'s keeper
    code, status = await subres.refused(url(subres, "vm1", console="sol"), V5)
    assert code == 400
    assert status["message"] == (
        "Machine default/vm1 has no console 'sol' (its consoles: serial0, serial1)"
    )
    assert [s.accepted for s in serials] == [1, 1]


async def test_every_console_is_kept_logged_and_recorded_on_its_own(
    subres: Standalone, serials: tuple[Backend, Backend], tmp_path: Path
) -> None:
    await wait_for(lambda: [s.open for s in serials] == [1, 1])  # both of `kept`'s consoles
    async with subres.websocket(url(subres, "kept", console="serial1"), V5) as one:
        await typed(one, b"to one\n", b"[ttyS1]")
    async with subres.websocket(url(subres, "kept"), V5) as zero:
        await typed(zero, b"to zero\n", b"[ttyS0]")
    assert await log(subres, "kept", "serial1") == b"[ttyS1]to one\n"
    assert await log(subres, "kept", "") == b"[ttyS0]to zero\n"
    await subres.server.state.recordings.stop()
    casts = sorted((tmp_path / "recordings" / "default" / "machines").glob("kept/*/*.cast"))
    titles = sorted(json.loads(p.read_text().splitlines()[0])["title"] for p in casts)
    assert titles == ["Machine default/kept console", "Machine default/kept console serial1"]
    texts = {p.name.split("-")[1]: p.read_text() for p in casts}
    assert "to one" in texts["serial1"] and "to one" not in "".join(
        t for n, t in texts.items() if n != "serial1"
    )
    assert [s.accepted for s in serials] == [1, 1]


async def log(subres: Standalone, name: str, console: str) -> bytes:
    query = f"?console={console}" if console else ""
    status, _, body = await subres.fetch(subres.url(name, "log", scheme="https") + query)
    assert status == 200, body
    return body


async def get_json(subres: Standalone, address: str) -> dict[str, Any]:
    status, _, body = await subres.fetch(address)
    assert status == 200, body
    parsed: dict[str, Any] = json.loads(body)
    return parsed


@pytest.mark.parametrize("transport", ["spdy", "websocket"])
async def test_client_go_picks_a_console_in_either_dialect(
    subres: Standalone, kubepeer_bin: Path, transport: str
) -> None:
    proc = await start_exec(
        kubepeer_bin, subres, "vm1", transport=transport, sub="console?console=serial1"
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(b"through client-go\n")
        async with asyncio.timeout(TIMEOUT):
            assert await proc.stdout.readexactly(25) == b"[ttyS1]through client-go\n"
    finally:
        proc.kill()
        await proc.wait()
