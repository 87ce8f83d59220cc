"""SPDY sessions against our own codec client: the edge cases client-go never produces."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from subres.protocol.spdy import (
    DataReceived,
    GoAwayReceived,
    PingAcknowledged,
    StreamEnded,
    StreamReplied,
    StreamReset,
)
from subres.server import portforward_spdy
from tests.engine.spdyclient import SpdyClient
from tests.server.kubepeer import machine_path, pf_machine
from tests.support import Backend, Standalone, open_fds, start_standalone, wait_for

PF = "portforward.k8s.io"


@pytest.fixture
def echo_port(backend: Backend) -> int:
    return int(backend.url.rsplit(":", 1)[1])


@pytest.fixture
async def subres(tmp_path: Path, backend: Backend, echo_port: int) -> AsyncIterator[Standalone]:
    async with start_standalone(tmp_path, pf_machine("vm1", [echo_port], console=backend.url)) as s:
        yield s


async def forward(subres: Standalone) -> SpdyClient:
    return await SpdyClient.upgrade(subres, machine_path("vm1", "portforward"), PF)


def stream_headers(
    kind: str, port: int | str, request_id: str | None = None
) -> list[tuple[str, str]]:
    headers = [("streamtype", kind), ("port", str(port))]
    return headers + ([("requestid", request_id)] if request_id is not None else [])


async def echo_through(client: SpdyClient, data_id: int, payload: bytes) -> bytes:
    await client.send(data_id, payload, fin=True)
    got = bytearray()
    while True:
        event = await client.next_event()
        assert event is not None
        if isinstance(event, DataReceived) and event.stream_id == data_id:
            got += event.data
        if isinstance(event, StreamEnded) and event.stream_id == data_id:
            return bytes(got)


async def test_101_names_the_protocol_and_nothing_comes_before_our_first_frame(
    subres: Standalone,
) -> None:
    client = await SpdyClient.upgrade(
        subres, machine_path("vm1", "portforward"), "v9.example", f"x, {PF}"
    )
    assert b"\r\nX-Stream-Protocol-Version: portforward.k8s.io\r\n" in client.head
    assert b"\r\nUpgrade: SPDY/3.1\r\n" in client.head
    ping = client.conn.ping()
    await client.flush()
    # The first bytes the server sends are the echo: it spoke only after us.
    assert await client.next_event() == PingAcknowledged(ping)
    await client.close()


async def test_streams_without_requestid_pair_by_stream_id(
    subres: Standalone, echo_port: int
) -> None:
    client = await forward(subres)
    error_id = await client.open(stream_headers("error", echo_port))
    data_id = await client.open(stream_headers("data", echo_port))
    assert data_id == error_id + 2
    await client.expect(StreamReplied, stream_id=data_id)
    payload = os.urandom(1 << 20)
    assert await echo_through(client, data_id, payload) == payload
    await client.close()


async def test_tunnelled_spdy_ignores_message_boundaries(
    subres: Standalone, echo_port: int
) -> None:
    async with aiohttp.ClientSession() as http:
        client = await SpdyClient.tunnel(http, subres, machine_path("vm1", "portforward"))
        await client.open(stream_headers("error", echo_port, "0"))
        data_id = await client.open(stream_headers("data", echo_port, "0"))
        assert await echo_through(client, data_id, b"one byte per message") == (
            b"one byte per message"
        )
        await client.close()


async def test_pairing_timeout_is_reported_on_the_error_stream(
    subres: Standalone, echo_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(portforward_spdy, "PAIRING_TIMEOUT", 0.2)
    client = await forward(subres)
    error_id = await client.open(stream_headers("error", echo_port, "7"))
    message = await client.expect(DataReceived, stream_id=error_id)
    assert message.data == b"request 7: timed out waiting for streams"
    await client.expect(StreamEnded, stream_id=error_id)
    await client.close()


async def test_disallowed_port_is_text_on_the_error_stream_then_both_end(
    subres: Standalone, echo_port: int
) -> None:
    client = await forward(subres)
    error_id = await client.open(stream_headers("error", 9, "0"))
    data_id = await client.open(stream_headers("data", 9, "0"))
    message = await client.expect(DataReceived, stream_id=error_id)
    assert message.data == (
        b"error forwarding port 9: Machine default/vm1 does not allow forwarding to tcp port 9"
    )
    await client.expect(StreamEnded, stream_id=error_id)
    await client.expect(StreamEnded, stream_id=data_id)
    # The connection lives on: another pair still forwards.
    await client.open(stream_headers("error", echo_port, "1"))
    second = await client.open(stream_headers("data", echo_port, "1"))
    assert await echo_through(client, second, b"still here") == b"still here"
    await client.close()


@pytest.mark.parametrize(
    "headers",
    [
        [("streamtype", "data")],
        [("streamtype", "data"), ("port", "0")],
        [("streamtype", "data"), ("port", "65536")],
        [("streamtype", "data"), ("port", "http")],
        [("port", "80")],
        [("streamtype", "stdin"), ("port", "80")],
    ],
)
async def test_streams_with_bad_headers_are_reset(
    subres: Standalone, headers: list[tuple[str, str]]
) -> None:
    client = await forward(subres)
    stream_id = await client.open(headers)
    await client.expect(StreamReset, stream_id=stream_id)
    await client.close()


async def test_second_stream_of_a_type_is_reset_and_reported(
    subres: Standalone, echo_port: int
) -> None:
    client = await forward(subres)
    first = await client.open(stream_headers("error", echo_port, "3"))
    again = await client.open(stream_headers("error", echo_port, "3"))
    await client.expect(StreamReset, stream_id=again)
    message = await client.expect(DataReceived, stream_id=first)
    assert message.data == b"error processing stream for request 3: error stream already assigned"
    await client.close()


async def test_console_ends_with_status_then_goaway_last(subres: Standalone) -> None:
    client = await SpdyClient.upgrade(subres, machine_path("vm1", "console"), "v4.channel.k8s.io")
    error_id = await client.open([("streamtype", "error")])
    stdin_id = await client.open([("streamtype", "stdin")])
    stdout_id = await client.open([("streamtype", "stdout")])
    await client.open([("streamtype", "resize")])
    await client.expect(StreamReplied, stream_id=stdout_id)
    await client.send(stdin_id, b"hello", fin=True)
    assert (await client.expect(DataReceived, stream_id=stdout_id)).data == b"hello"
    await client.expect(StreamEnded, stream_id=stdout_id)
    status = await client.expect(DataReceived, stream_id=error_id)
    assert json.loads(bytes(status.data))["status"] == "Success"
    rest = []
    while not isinstance(event := await client.next_event(), GoAwayReceived):
        rest.append(event)
    assert not client.events, "GOAWAY must be the last frame"
    assert all(not isinstance(e, DataReceived) for e in rest)
    await client.close()


async def test_vanishing_codec_client_leaves_nothing(
    subres: Standalone, backend: Backend, echo_port: int
) -> None:
    tasks, fds = len(asyncio.all_tasks()), open_fds()
    clients = []
    for request in range(3):
        client = await forward(subres)
        await client.open(stream_headers("error", echo_port, str(request)))
        data_id = await client.open(stream_headers("data", echo_port, str(request)))
        await client.expect(StreamReplied, stream_id=data_id)
        await client.send(data_id, os.urandom(1 << 20))
        clients.append(client)
    await backend.wait_open(3)
    for client in clients:
        await client.close()
    await backend.wait_open(0)
    await wait_for(lambda: len(asyncio.all_tasks()) <= tasks and open_fds() <= fds)
    assert len(subres.server.state.sessions) == 0
