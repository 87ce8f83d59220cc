"""Observers of a console: read-only, any number, every dialect, through takeovers.

The backend echoes what it receives and keeps a copy, so a test sees both
what every client got and exactly what reached the machine.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import websockets
from websockets.asyncio.client import ClientConnection, connect

from tests.consoles import Console, closed
from tests.server.kubepeer import start_exec
from tests.server.test_console import (
    BASE64_DIALECTS,
    CHANNEL_DIALECTS,
    RAW_DIALECTS,
    frame,
    read_stdout,
    unframe,
)
from tests.support import Backend, Standalone, machine, start_standalone, wait_for

TIMEOUT = 10.0


@pytest.fixture
async def subres(tmp_path: Path, serial: Backend) -> AsyncIterator[Standalone]:
    async with start_standalone(
        tmp_path,
        machine("vm1", console=serial.url),
        machine("stopped", console=serial.url, phase="Stopped"),
        session={"observerBacklog": 256 * 1024},
    ) as s:
        yield s


def join(
    subres: Standalone, sub: str, dialect: str | None, *, user: str = "alice", query: str = ""
) -> connect:
    """Open `sub` ("console" or "console-observe") of vm1 as `user`."""
    return subres.websocket(
        subres.url("vm1", sub) + query, *([dialect] if dialect else []), user=user
    )


async def skip_hello(ws: ClientConnection, dialect: str | None) -> None:
    """Channel dialects start with an empty stdout message."""
    if dialect not in RAW_DIALECTS:
        assert unframe(dialect, await asyncio.wait_for(ws.recv(), TIMEOUT)) == (1, b"")


def every_dialect() -> Iterator[str | None]:
    yield from CHANNEL_DIALECTS + BASE64_DIALECTS + RAW_DIALECTS


@pytest.mark.parametrize("dialect", list(every_dialect()))
async def test_observers_see_the_writers_output_and_cannot_type(
    subres: Standalone, console: Console, dialect: str | None
) -> None:
    payload = os.urandom(200_000)
    async with (
        join(subres, "console-observe", dialect, user="bob") as bob,
        join(subres, "console-observe", "v5.channel.k8s.io", user="carol") as carol,
        join(subres, "console", "v4.channel.k8s.io") as alice,
    ):
        await skip_hello(bob, dialect)
        await skip_hello(carol, "v5.channel.k8s.io")
        await skip_hello(alice, "v4.channel.k8s.io")
        # What observers type is dropped, whatever the channel.
        await bob.send(frame(dialect, 0, b"rm -rf /\n"))
        await carol.send(frame("v5.channel.k8s.io", 0, b"reboot\n"))
        await alice.send(frame("v4.channel.k8s.io", 0, payload))
        for ws, d in ((alice, "v4.channel.k8s.io"), (bob, dialect), (carol, "v5.channel.k8s.io")):
            got = await read_stdout(ws, d, len(payload))
            assert hashlib.sha256(got).digest() == hashlib.sha256(payload).digest()
    assert bytes(console.received) == payload


async def test_observers_survive_a_takeover_between_writers(
    subres: Standalone, console: Console
) -> None:
    dialect = "v5.channel.k8s.io"
    async with join(subres, "console-observe", dialect, user="carol") as carol:
        await skip_hello(carol, dialect)
        async with join(subres, "console", dialect) as alice:
            await skip_hello(alice, dialect)
            await alice.send(frame(dialect, 0, b"from alice\n"))
            assert await read_stdout(carol, dialect, 11) == b"from alice\n"
            async with join(subres, "console", dialect, user="bob") as bob:
                await skip_hello(bob, dialect)
                assert await closed(alice) == (4001, "console of default/vm1 taken over by bob")
                await bob.send(frame(dialect, 0, b"from bob\n"))
                assert await read_stdout(carol, dialect, 9) == b"from bob\n"
        # Between writers an observer stays, and sees the next writer.
        async with join(subres, "console", dialect) as alice:
            await skip_hello(alice, dialect)
            await alice.send(frame(dialect, 0, b"again\n"))
            assert await read_stdout(carol, dialect, 6) == b"again\n"
    assert bytes(console.received) == b"from alice\nfrom bob\nagain\n"


async def test_the_consoles_end_ends_its_observers_cleanly(subres: Standalone) -> None:
    dialect = "v5.channel.k8s.io"
    async with (
        join(subres, "console-observe", dialect, user="bob") as bob,
        join(subres, "console", dialect) as alice,
    ):
        await skip_hello(bob, dialect)
        await skip_hello(alice, dialect)
        # v5 close signal: stdin ends, the echo backend half-closes back, the console ends.
        await alice.send(bytes((255, 0)))
        for ws in (alice, bob):
            async with asyncio.timeout(TIMEOUT):
                messages = [unframe(dialect, m) async for m in ws]
            assert messages[-1][0] == 3 and b'"Success"' in messages[-1][1]
            assert ws.close_code == 1000


async def test_a_slow_observer_is_cut_off_and_the_writer_is_not_held_back(
    subres: Standalone,
) -> None:
    dialect = "v5.channel.k8s.io"
    payload = os.urandom(24 << 20)
    async with (
        join(subres, "console-observe", dialect, user="bob") as bob,
        join(subres, "console", dialect) as alice,
    ):
        await skip_hello(alice, dialect)
        bob.transport.pause_reading()  # bob reads nothing: his backlog grows

        async def send() -> None:
            for i in range(0, len(payload), 1 << 19):
                await alice.send(frame(dialect, 0, payload[i : i + (1 << 19)]))

        sender = asyncio.create_task(send())
        got = await read_stdout(alice, dialect, len(payload))
        await sender
        assert hashlib.sha256(got).digest() == hashlib.sha256(payload).digest()
        bob.transport.resume_reading()
        assert await closed(bob) == (4002, "fell more than 256 KiB behind the console")


async def test_observers_leave_nothing_behind(subres: Standalone) -> None:
    dialect = "v5.channel.k8s.io"
    async with join(subres, "console-observe", dialect, user="bob") as bob:
        await skip_hello(bob, dialect)
        async with join(subres, "console", dialect) as alice:
            await skip_hello(alice, dialect)
        sessions = subres.server.state.sessions
        assert len(sessions.hubs) == 1
    await wait_for(lambda: not sessions.hubs and not sessions.live)


async def test_observing_checks_the_machine_before_upgrading(subres: Standalone) -> None:
    with pytest.raises(websockets.InvalidStatus) as refused:
        async with join(subres, "console-observe", "v5.channel.k8s.io", query="?tail=x"):
            pass
    assert refused.value.response.status_code == 400
    with pytest.raises(websockets.InvalidStatus) as stopped:
        async with subres.websocket(subres.url("stopped", "console-observe")):
            pass
    assert stopped.value.response.status_code == 409


async def test_an_observer_over_spdy_sees_output_and_its_stdin_goes_nowhere(
    subres: Standalone, console: Console, kubepeer_bin: Path
) -> None:
    peer = await start_exec(kubepeer_bin, subres, "vm1", sub="console-observe", transport="spdy")
    assert peer.stdin is not None and peer.stdout is not None
    try:
        sessions = subres.server.state.sessions
        await wait_for(lambda: len(sessions.live) == 1)
        peer.stdin.write(b"typed by an observer\n")
        await peer.stdin.drain()
        dialect = "v5.channel.k8s.io"
        async with join(subres, "console", dialect) as alice:
            await skip_hello(alice, dialect)
            await alice.send(frame(dialect, 0, b"hello spdy\n"))
            async with asyncio.timeout(TIMEOUT):
                assert await peer.stdout.readexactly(11) == b"hello spdy\n"
    finally:
        peer.kill()
        await peer.wait()
    assert bytes(console.received) == b"hello spdy\n"
