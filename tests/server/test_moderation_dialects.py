"""Moderation in every dialect a console speaks, reached at its owner or relayed by another replica.

A policy selects writers by group (`contractors`) and wants one member of
`sre-leads` watching. alice, a contractor, and mia, a moderator, reach the
console's owner directly or through the other replica, as kube-apiserver's
Service picks one: either way the owner must see every group of theirs (the
user crosses the peer hop whole), so alice waits, told why, and nothing of
hers reaches the machine (her bytes dropped, her end of input held) until mia
watches. The rows come from the console's own tables: its WebSocket
subprotocols (`server.console.SUBPROTOCOLS`) and SPDY remote-command
protocols (`server.remotecommand.PROTOCOLS`); the end of input from the
dialects that can send one (`channels.Dialect.close_signal`, and every SPDY
stdin's FIN).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import pytest

from subres.protocol.channels import DIALECTS
from subres.protocol.spdy import DataReceived
from subres.server import console, remotecommand
from subres.server.run import Server
from subres.serving import certs
from tests.consoles import WAIT, Console
from tests.engine.spdyclient import SpdyClient
from tests.server.replicas import PATH, as_user, owner_and_other, replicas, url
from tests.server.test_cluster import PROXY_CA, client_ssl
from tests.server.test_console import frame, unframe
from tests.support import Backend, wait_for

POLICY = {
    "moderation": [
        {"name": "contract", "groups": ["contractors"], "moderators": {"groups": ["sre-leads"]}}
    ]
}
WAITING = b"waiting for 1 moderator (a member of sre-leads) to watch, as policy contract requires"
STARTS = b"mia moderating; the session starts"
WRITER = ("alice", ["contractors"])
MODERATOR = ("mia", ["sre-leads"])

WEBSOCKET = [("ws", dialect) for dialect in console.SUBPROTOCOLS]
SPDY = [("spdy", protocol) for protocol in remotecommand.PROTOCOLS]
ENDING_INPUT = [
    ("ws", d) for d in console.SUBPROTOCOLS if d in DIALECTS and DIALECTS[d].close_signal
]
REACHED = ("owner", "relayed")


@dataclass(frozen=True)
class Row:
    """A dialect (`carrier` ws or spdy, and its subprotocol) and how the owner is reached."""

    carrier: str
    dialect: str
    reached: str

    def front(self, servers: list[Server]) -> Server:
        """The replica the clients reach: the owner, or the other one."""
        owner, other = owner_and_other(servers)
        return owner if self.reached == "owner" else other


def rows(dialects: list[tuple[str, str]], proves: str) -> list[Any]:
    """One row per dialect and way of reaching the owner, named for what it proves."""
    return [
        pytest.param(
            Row(carrier, dialect, reached),
            id=f"{carrier}-{dialect or 'raw'}-{reached}-{proves}",
        )
        for carrier, dialect in dialects
        for reached in REACHED
    ]


class Writer(Protocol):
    """A console writer in one dialect."""

    async def stdout_until(self, text: bytes) -> bytes: ...
    async def type(self, data: bytes) -> None: ...
    async def end_input(self) -> None: ...


class WebSocketWriter:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse, dialect: str) -> None:
        self.ws = ws
        self.dialect = dialect or None

    async def stdout_until(self, text: bytes) -> bytes:
        seen = b""
        async with asyncio.timeout(WAIT):
            while text not in seen:
                message = await self.ws.receive()
                assert message.type in (aiohttp.WSMsgType.BINARY, aiohttp.WSMsgType.TEXT), message
                channel, data = unframe(self.dialect, message.data)
                seen += data if channel == 1 else b""
        return seen

    async def type(self, data: bytes) -> None:
        framed = frame(self.dialect, 0, data)
        if isinstance(framed, str):
            await self.ws.send_str(framed)
        else:
            await self.ws.send_bytes(framed)

    async def end_input(self) -> None:
        await self.ws.send_bytes(bytes([0xFF, 0]))  # v5: close stdin


class SpdyWriter:
    def __init__(self, client: SpdyClient, stdin: int, stdout: int) -> None:
        self.client, self.stdin, self.stdout = client, stdin, stdout

    async def stdout_until(self, text: bytes) -> bytes:
        seen = b""
        while text not in seen:
            event = await self.client.next_event()  # bounded: SpdyClient waits 10 s at most
            assert event is not None, f"the session ended before {text!r}: {seen!r}"
            if isinstance(event, DataReceived) and event.stream_id == self.stdout:
                seen += event.data
        return seen

    async def type(self, data: bytes) -> None:
        await self.client.send(self.stdin, data)

    async def end_input(self) -> None:
        await self.client.send(self.stdin, b"", fin=True)


def proxied(tmp: Path, user: str, groups: list[str]) -> dict[str, Any]:
    """`as_user` with `groups`, each its own X-Remote-Group header as kube-apiserver sends."""
    found = as_user(tmp, user)
    found["headers"] = [*found["headers"].items(), *(("X-Remote-Group", g) for g in groups)]
    return found


@contextlib.asynccontextmanager
async def writer(
    row: Row, front: Server, tmp: Path, http: aiohttp.ClientSession
) -> AsyncIterator[Writer]:
    """alice, a contractor, writing on `front` in the row's dialect."""
    dialect = row.dialect
    if row.carrier == "ws":
        async with http.ws_connect(
            url(front, "console"), protocols=(dialect,) if dialect else (), **proxied(tmp, *WRITER)
        ) as ws:
            yield WebSocketWriter(ws, dialect)
        return
    client = await spdy(front, tmp, dialect, *WRITER)
    try:
        await client.open([("streamtype", "error")])
        stdin = await client.open([("streamtype", "stdin")])
        stdout = await client.open([("streamtype", "stdout")])
        yield SpdyWriter(client, stdin, stdout)
    finally:
        await client.close()


async def spdy(front: Server, tmp: Path, protocol: str, user: str, groups: list[str]) -> SpdyClient:
    """A SPDY remote-command session on `front`'s console, upgraded as kube-apiserver's proxy."""
    proxy = client_ssl(tmp, certs.issue_client(PROXY_CA, user="front-proxy-client", groups=[]))
    reader, stream = await asyncio.open_connection(
        "127.0.0.1", front.port, ssl=proxy, server_hostname="localhost"
    )
    head = "".join(f"X-Remote-Group: {g}\r\n" for g in groups)
    stream.write(
        f"POST {PATH}console HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n"
        f"X-Remote-User: {user}\r\n{head}X-Stream-Protocol-Version: {protocol}\r\n"
        "Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\r\n".encode()
    )
    async with asyncio.timeout(WAIT):
        answer = await reader.readuntil(b"\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 101 "), answer

    async def write(data: bytes) -> None:
        stream.write(data)
        await stream.drain()

    async def close() -> None:
        stream.close()

    return SpdyClient(lambda: reader.read(65536), write, close)


def holding_eof(owner: Server) -> bool:
    """The owner holds a moderated writer's end of input."""
    gates = owner.state.sessions.gates.values()
    return any(getattr(s, "holding_eof", False) for gate in gates for s in gate.sessions)


@pytest.mark.parametrize("row", rows(WEBSOCKET + SPDY, "group-selected-writer-waits"))
async def test_a_writer_selected_by_group_waits_for_a_moderator_through_either_replica(
    tmp_path: Path, serial: Backend, console: Console, row: Row
) -> None:
    async with (
        replicas(tmp_path, serial, config=lambda _: POLICY) as (_, servers),
        aiohttp.ClientSession() as http,
    ):
        front = row.front(servers)
        async with writer(row, front, tmp_path, http) as alice:
            await alice.stdout_until(WAITING)
            await alice.type(b"dropped\r")
            async with http.ws_connect(
                url(front, "console-moderate"), **proxied(tmp_path, *MODERATOR)
            ):
                await alice.stdout_until(STARTS)
                await alice.type(b"watched\r")
                await alice.stdout_until(b"watched\r")
    assert bytes(console.received) == b"watched\r"


@pytest.mark.parametrize(
    "reached", [pytest.param(r, id=f"{r}-outsider-refused-undialled") for r in REACHED]
)
async def test_someone_outside_the_moderator_groups_is_refused_through_either_replica(
    tmp_path: Path, serial: Backend, reached: str
) -> None:
    async with (
        replicas(tmp_path, serial, config=lambda _: POLICY) as (_, servers),
        aiohttp.ClientSession() as http,
    ):
        owner, other = owner_and_other(servers)
        front = owner if reached == "owner" else other
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(
                url(front, "console-moderate"), **proxied(tmp_path, "carol", ["devs"])
            )
        assert refused.value.status == 403
    assert serial.accepted == 0


@pytest.mark.parametrize("row", rows(ENDING_INPUT + SPDY, "end-of-input-held"))
async def test_a_writers_end_of_input_waits_for_a_moderator_as_its_bytes_do(
    tmp_path: Path, serial: Backend, console: Console, row: Row
) -> None:
    async with (
        replicas(tmp_path, serial, config=lambda _: POLICY) as (_, servers),
        aiohttp.ClientSession() as http,
    ):
        owner, _ = owner_and_other(servers)
        front = row.front(servers)
        async with writer(row, front, tmp_path, http) as alice:
            await alice.stdout_until(WAITING)
            await alice.end_input()
            await wait_for(lambda: console.ended.is_set() or holding_eof(owner))
            assert not console.ended.is_set(), "the machine saw the end of input unwatched"
            async with http.ws_connect(
                url(front, "console-moderate"), **proxied(tmp_path, *MODERATOR)
            ):
                await alice.stdout_until(STARTS)
                async with asyncio.timeout(WAIT):
                    await console.ended.wait()
