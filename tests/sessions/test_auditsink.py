"""Session audit events to a webhook: what the sink receives, and what waits while it is down.

The sink is a real HTTP server on loopback that answers as told (2xx, 503, 400),
records every CloudEvent it takes, and can be stopped and started again on the
same port. Nothing is lost across a sink outage or a restart of the sender on
the same spool; what the spool cannot hold, or the sink refuses, is counted.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from subres.serving.metrics import Metrics
from subres.sessions.auditsink import CONTENT_TYPE, SinkSettings, WebhookSink, cloudevent
from tests.server.test_options import options
from tests.support import Backend, machine, start_standalone, wait_for

V5 = "v5.channel.k8s.io"


class Sink:
    """An HTTP audit sink on 127.0.0.1 that answers `status` and keeps what it took."""

    def __init__(self) -> None:
        self.status = 200
        self.events: list[dict[str, Any]] = []
        self.requests: list[web.Request] = []
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/audit"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/audit", self._take)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _take(self, request: web.Request) -> web.Response:
        self.requests.append(request)
        if self.status // 100 == 2:
            assert request.content_type == CONTENT_TYPE
            self.events.extend(await request.json())
        return web.Response(status=self.status)

    def ids(self) -> list[str]:
        return [e["id"] for e in self.events]


@pytest.fixture
async def sink() -> AsyncIterator[Sink]:
    s = Sink()
    await s.start()
    yield s
    await s.stop()


def _event(n: int) -> bytes:
    return cloudevent(source="subres/test", stage="start", time=None, data={"n": n})


def _sample(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


async def _sender(tmp: Path, sink: Sink, metrics: Metrics, **settings: Any) -> WebhookSink:
    sender = WebhookSink(
        SinkSettings(url=sink.url, spool=tmp / "spool", **settings), metrics=metrics
    )
    await sender.start()
    return sender


async def test_a_session_reaches_the_sink_as_two_cloudevents(tmp_path: Path, sink: Sink) -> None:
    backend = await Backend().start_tcp()
    options = {
        "session_audit_sink": SinkSettings(url=sink.url, spool=tmp_path / "spool"),
    }
    try:
        async with start_standalone(
            tmp_path, machine("vm1", console=backend.url), options=options
        ) as s:
            async with s.websocket(s.url("vm1"), V5) as alice:
                await alice.recv()  # the empty stdout frame a v5 session opens with
                await alice.send(b"\x00hello")
                assert await asyncio.wait_for(alice.recv(), 5) == b"\x01hello"
            await wait_for(lambda: len(sink.events) == 2)
            lines = s.audit_lines()
    finally:
        await backend.stop()
    start, end = sink.events
    assert [e["type"] for e in sink.events] == [
        "dev.subres.session.start",
        "dev.subres.session.end",
    ]
    assert {e["specversion"] for e in sink.events} == {"1.0"}
    assert start["source"] == "subres" and start["datacontenttype"] == "application/json"
    # The event's data is the audit line itself, and its time the session's.
    assert [start["data"], end["data"]] == lines
    assert (start["time"], end["time"]) == (lines[0]["start"], lines[1]["end"])
    assert end["data"]["user"] == "alice"


async def test_events_wait_on_disk_while_the_sink_is_down_and_none_is_lost(
    tmp_path: Path, sink: Sink
) -> None:
    metrics = Metrics()
    await sink.stop()
    sender = await _sender(tmp_path, sink, metrics)
    try:
        for n in range(300):
            sender.add(_event(n))
        await wait_for(lambda: _sample(metrics, "subres_audit_send_failures_total") >= 1)
        assert sender.spool.pending == 300
        assert sum(p.stat().st_size for p in (tmp_path / "spool").glob("*.jsonl")) > 0
        await sink.start()
        # The first retry waits out the backoff (0.5 s, doubling): bounded well within 5 s.
        await wait_for(lambda: len(sink.events) == 300)
    finally:
        await sender.close()
    assert [e["data"]["n"] for e in sink.events] == list(range(300))
    assert len(set(sink.ids())) == 300
    assert _sample(metrics, "subres_audit_events_sent_total") == 300
    assert _sample(metrics, "subres_audit_events_buffered") == 0


async def test_a_restarted_sender_sends_what_its_predecessor_left(
    tmp_path: Path, sink: Sink
) -> None:
    sink.status = 503
    first = await _sender(tmp_path, sink, Metrics())
    for n in range(10):
        first.add(_event(n))
    await wait_for(lambda: len(sink.requests) >= 1)
    await first.close()
    # A kill in the middle of a line leaves it cut: it is never sent, the rest is.
    segment = max((tmp_path / "spool").glob("*.jsonl"))
    with segment.open("ab") as cut:
        cut.write(b'{"specversion":"1.0","id":"cut')
    sink.status = 200
    metrics = Metrics()
    second = await _sender(tmp_path, sink, metrics)
    try:
        assert _sample(metrics, "subres_audit_events_buffered") == 10
        second.add(_event(10))
        await wait_for(lambda: len(sink.events) == 11)
    finally:
        await second.close()
    assert [e["data"]["n"] for e in sink.events] == list(range(11))
    # Sent segments are removed: the spool does not grow with what was delivered.
    assert len(list((tmp_path / "spool").glob("*.jsonl"))) <= 2


async def test_a_full_spool_drops_new_events_counts_them_and_says_so_once(
    tmp_path: Path, sink: Sink, caplog: pytest.LogCaptureFixture
) -> None:
    metrics = Metrics()
    sink.status = 503
    size = len(_event(0))
    sender = await _sender(tmp_path, sink, metrics, max_bytes=5 * size)
    try:
        with caplog.at_level(logging.ERROR, logger="subres.sessions.auditsink"):
            for n in range(8):
                sender.add(_event(n))
        assert _sample(metrics, "subres_audit_events_dropped_total", reason="spool") == 3
        assert len([r for r in caplog.records if "spool is full" in r.message]) == 1
        sink.status = 200
        await wait_for(lambda: len(sink.events) == 5)
    finally:
        await sender.close()
    assert [e["data"]["n"] for e in sink.events] == list(range(5))


async def test_a_refused_batch_is_dropped_and_counted_and_later_events_still_go(
    tmp_path: Path, sink: Sink
) -> None:
    metrics = Metrics()
    sink.status = 400
    sender = await _sender(tmp_path, sink, metrics)
    try:
        sender.add(_event(0))
        await wait_for(
            lambda: _sample(metrics, "subres_audit_events_dropped_total", reason="refused") == 1
        )
        sink.status = 200
        sender.add(_event(1))
        await wait_for(lambda: len(sink.events) == 1)
    finally:
        await sender.close()
    assert sink.events[0]["data"] == {"n": 1}


async def test_the_token_goes_with_every_request(tmp_path: Path, sink: Sink) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    sender = await _sender(tmp_path, sink, Metrics(), token_file=token)
    try:
        sender.add(_event(0))
        await wait_for(lambda: len(sink.events) == 1)
    finally:
        await sender.close()
    assert sink.requests[0].headers["Authorization"] == "Bearer s3cret"


def test_the_batch_is_json_as_the_cloudevents_batch_mode_has_it() -> None:
    event = json.loads(_event(7))
    assert set(event) == {"specversion", "id", "source", "type", "time", "datacontenttype", "data"}
    assert len(event["id"]) == 32


def test_the_webhook_needs_a_spool() -> None:
    alone = options("--session-audit-webhook", "http://127.0.0.1:1/")
    assert "--session-audit-webhook needs --session-audit-spool DIR" in alone.validate()
    spooled = options(
        "--session-audit-webhook=http://127.0.0.1:1/",
        "--session-audit-spool=/tmp/x",
        "--session-audit-spool-max=64Mi",
    )
    assert spooled.validate() == []
    assert spooled.session_audit_sink is not None
    assert spooled.session_audit_sink.max_bytes == 64 << 20
