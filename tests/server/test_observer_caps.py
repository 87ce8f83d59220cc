"""Observers are bounded per console or display and per replica: 429 before any upgrade.

Observers that never read are what took a replica past its memory limit: here
they hold their places, and the next one gets a Status (429, Retry-After) and
no feed, no backend connection. A place comes back when its session ends,
however it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from websockets.asyncio.client import ClientConnection

from tests.consoles import Console
from tests.server.replicas import PATH, as_user, owner_and_other, replicas, url
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


KEEP = {"subres.dev/keep-console": "true"}


@contextlib.asynccontextmanager
async def silent_follower(
    port: int, ctx: ssl.SSLContext, path: str, headers: dict[str, str]
) -> AsyncIterator[tuple[bytes, asyncio.StreamReader]]:
    """A `log?follow=true` reader that reads its answer's head, then nothing."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
    try:
        lines = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        writer.write(f"GET {path} HTTP/1.1\r\nHost: localhost\r\n{lines}\r\n".encode())
        async with asyncio.timeout(10):
            yield await reader.readuntil(b"\r\n\r\n"), reader
    finally:
        writer.transport.abort()


@pytest.mark.parametrize(
    "reached",
    [pytest.param(r, id=f"log-follow-{r}-counts-as-observer") for r in ("owner", "relayed")],
)
async def test_log_followers_take_observer_places_and_one_more_is_refused_429(
    tmp_path: Path, backend: Backend, reached: str
) -> None:
    caps = {"session": {"maxObserversPerConsole": 2, "maxObservers": 100}}
    async with (
        replicas(tmp_path, backend, config=lambda _: caps, annotations=KEEP) as (_, servers),
        contextlib.AsyncExitStack() as stack,
        aiohttp.ClientSession() as http,
    ):
        owner, other = owner_and_other(servers)
        front = owner if reached == "owner" else other
        await wait_for(lambda: bool(owner.state.sessions.hubs))  # kept
        path = f"{PATH}log?follow=true"
        proxy = as_user(tmp_path, "olive")
        # One at the owner, one through the replica the row reaches: the owner's answer to
        # the next one (429, Retry-After) comes back through that replica as it was.
        for reached_ in (owner, front):
            head, _ = await stack.enter_async_context(
                silent_follower(reached_.port, proxy["ssl"], path, proxy["headers"])
            )
            assert head.startswith(b"HTTP/1.1 200 "), head
        url_ = f"https://127.0.0.1:{front.port}{path}"
        async with http.get(url_, **as_user(tmp_path, "otto")) as refused:
            status = await refused.json()
            assert (refused.status, refused.headers["Retry-After"]) == (429, "5")
        assert "console of Machine default/vm has 2 observers" in status["message"]
        assert "session.maxObserversPerConsole" in status["message"]
        assert status["details"]["retryAfterSeconds"] == 5
        # Followers and observers share the places.
        with pytest.raises(aiohttp.WSServerHandshakeError) as observer:
            await http.ws_connect(url(front, "console-observe"), **as_user(tmp_path, "oz"))
        assert observer.value.status == 429
        # A replica relaying a follower holds its answer's buffers: it counts it too.
        relaying = 1 if front is other else 0
        assert owner.state.observers.all == 2 and other.state.observers.all == relaying
    await wait_for(lambda: owner.state.observers.all == other.state.observers.all == 0)


async def test_a_log_follower_that_never_reads_is_cut_off_and_gives_its_place_back(
    tmp_path: Path, serial: Backend, console: Console, caplog: pytest.LogCaptureFixture
) -> None:
    backlog = 256 << 10
    async with start_standalone(
        tmp_path,
        machine("vm1", console=serial.url, annotations=KEEP),
        session={"observerBacklog": backlog},
    ) as subres:
        await serial.wait_open(1)
        observers = subres.server.state.observers
        path = f"{subres.url('vm1', 'log', scheme='https').split(str(subres.server.port))[1]}"
        async with silent_follower(
            subres.server.port, subres.client_ssl, path + "?follow=true", subres.auth
        ) as (head, reader):
            assert head.startswith(b"HTTP/1.1 200 "), head
            assert observers.all == 1
            with caplog.at_level(logging.INFO, logger="subres.sessions.follower"):
                async with asyncio.timeout(60):
                    while observers.all:  # until its place comes back
                        await console.say(b"x" * 4095 + b"\n")
            assert "a log follower was cut off: fell more than 256 KiB behind the console" in (
                caplog.text
            )
            # Its answer ends with why (cut off while its socket still took what was sent),
            # or its connection was dropped (cut off while a send to it was stuck).
            rest = await until_the_end(reader)
            if rest.endswith(LAST_CHUNK):
                assert rest.endswith(CUT_OFF + LAST_CHUNK), rest[-200:]


LAST_CHUNK = b"\r\n0\r\n\r\n"
CUT_OFF = b"[subres: the log is cut off: it fell more than 256 KiB behind the console]\n"


async def until_the_end(reader: asyncio.StreamReader) -> bytes:
    """What is left of a chunked answer: up to its last chunk, or until its connection ends."""
    rest = b""
    with contextlib.suppress(ConnectionResetError):  # dropped: a reset is its end too
        async with asyncio.timeout(30):
            while not rest.endswith(LAST_CHUNK) and (data := await reader.read(1 << 20)):
                rest += data
    return rest
