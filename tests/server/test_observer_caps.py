"""Observers are bounded per console or display and per replica: 429 before any upgrade.

Observers that never read are what took a replica past its memory limit: here
they hold their places, and the next one gets a Status (429, Retry-After) and
no feed, no backend connection. A place comes back when its session ends,
however it ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from websockets.asyncio.client import ClientConnection

from tests.server.replicas import as_user, owner_and_other, replicas, url
from tests.server.test_vnc import vnc_machine
from tests.support import Backend, Standalone, machine, start_standalone, wait_for

PER_CONSOLE = 3
PER_REPLICA = 5


@pytest.fixture
async def subres(tmp_path: Path, serial: Backend, echo: Backend) -> AsyncIterator[Standalone]:
    async with start_standalone(
        tmp_path,
        machine("vm1", console=serial.url),
        machine("vm2", console=serial.url),
        vnc_machine("desk", echo.url),
        vnc_machine("dead", "tcp://127.0.0.1:1"),
        session={"maxObserversPerConsole": PER_CONSOLE, "maxObservers": PER_REPLICA},
    ) as s:
        yield s


async def hold(
    stack: contextlib.AsyncExitStack, subres: Standalone, name: str, sub: str, count: int
) -> list[ClientConnection]:
    """`count` observers of `name` that never read."""
    return [
        await stack.enter_async_context(subres.websocket(subres.url(name, sub), user="bob"))
        for _ in range(count)
    ]


async def test_a_console_and_the_replica_take_so_many_observers_and_no_more(
    subres: Standalone, serial: Backend
) -> None:
    observers = subres.server.state.observers
    async with contextlib.AsyncExitStack() as stack:
        await hold(stack, subres, "vm1", "console-observe", PER_CONSOLE)
        code, status = await subres.refused(subres.url("vm1", "console-observe"))
        assert (code, status["reason"]) == (429, "TooManyRequests")
        assert "console of Machine default/vm1 has 3 observers" in status["message"]
        assert "session.maxObserversPerConsole" in status["message"]
        assert status["details"]["retryAfterSeconds"] == 5
        hub = next(iter(subres.server.state.sessions.hubs.values()))
        assert len(hub.feeds) == PER_CONSOLE  # the refused one never attached
        await hold(stack, subres, "vm2", "console-observe", PER_REPLICA - PER_CONSOLE)
        code, status = await subres.refused(subres.url("vm2", "console-observe"))
        assert code == 429 and "session.maxObservers)" in status["message"], status
        # Writers are not observers: they still get in.
        async with subres.websocket(subres.url("vm2")) as writer:
            await writer.send(b"typed")
        assert observers.all == PER_REPLICA
    await wait_for(lambda: observers.all == 0)
    async with subres.websocket(subres.url("vm1", "console-observe")):
        assert observers.all == 1


async def test_display_observers_count_with_the_consoles(subres: Standalone, echo: Backend) -> None:
    async with contextlib.AsyncExitStack() as stack:
        await hold(stack, subres, "desk", "vnc-observe", PER_CONSOLE)
        await echo.wait_open(PER_CONSOLE)
        code, status = await subres.refused(subres.url("desk", "vnc-observe"))
        assert code == 429 and "vnc of Machine default/desk" in status["message"]
        await hold(stack, subres, "vm1", "console-observe", PER_REPLICA - PER_CONSOLE)
        code, _ = await subres.refused(subres.url("vm1", "console-observe"))
        assert code == 429
        assert echo.accepted == PER_CONSOLE  # a refused observer dials nothing
        # The interactive viewer is no observer.
        async with subres.websocket(subres.url("desk", "vnc")):
            await echo.wait_open(PER_CONSOLE + 1)


async def test_a_refused_or_failed_observer_gives_its_place_back(subres: Standalone) -> None:
    observers = subres.server.state.observers
    for _ in range(PER_REPLICA + 2):
        code, _ = await subres.refused(subres.url("dead", "vnc-observe"))
        assert code == 503
    assert observers.all == 0
    async with subres.websocket(subres.url("vm1", "console-observe")) as ws:
        ws.transport.abort()  # vanished, not closed
    await wait_for(lambda: observers.all == 0)


async def test_observers_through_another_replica_count_where_the_console_is(
    tmp_path: Path, backend: Backend
) -> None:
    caps = {"session": {"maxObserversPerConsole": 2, "maxObservers": 100}}
    async with (
        replicas(tmp_path, backend, config=lambda _: caps) as (_, servers),
        aiohttp.ClientSession() as http,
    ):
        owner, other = owner_and_other(servers)
        async with (
            http.ws_connect(url(other, "console-observe"), **as_user(tmp_path, "olive")),
            http.ws_connect(url(owner, "console-observe"), **as_user(tmp_path, "otto")),
        ):
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await http.ws_connect(url(other, "console-observe"), **as_user(tmp_path, "oz"))
            assert refused.value.status == 429
            assert owner.state.observers.all == 2 and other.state.observers.all == 0
        await wait_for(lambda: owner.state.observers.all == 0)
