"""Audit lines and Kubernetes Events: what an operator reads after the fact.

Audit lines are parsed from the file the server writes them to; Events are
read back from a fake apiserver in cluster mode (the real-apiserver e2e reads
them with kubectl).
"""

from __future__ import annotations

import asyncio
import io
import json
import sys
import threading
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import websockets

from subres.serving.metrics import Metrics
from subres.sessions import audit
from subres.sessions.audit import MAX_PENDING, SessionAudit
from subres.sessions.events import EventSettings, KubeEvents
from tests.server.test_cluster import client_ssl, cluster
from tests.support import GROUP_VERSION, Backend, Standalone, machine, start_standalone, wait_for

V5 = "v5.channel.k8s.io"


@pytest.fixture
async def subres(tmp_path: Path, backend: Backend) -> AsyncIterator[Standalone]:
    async with start_standalone(tmp_path, machine("vm1", console=backend.url)) as s:
        yield s


async def test_one_audit_line_per_session_start_and_end(subres: Standalone) -> None:
    async with websockets.connect(
        subres.url("vm1"),
        ssl=subres.client_ssl,
        additional_headers={**subres.auth, "Audit-Id": "request-42"},
        subprotocols=[websockets.Subprotocol(V5)],
    ) as alice:
        await alice.recv()
        async with subres.websocket(subres.url("vm1", "console-observe"), V5, user="bob") as bob:
            await bob.recv()
            await alice.send(b"\x00hello")
            assert await asyncio.wait_for(bob.recv(), 5) == b"\x01hello"
    await wait_for(lambda: len(subres.audit_lines()) == 4)
    lines = subres.audit_lines()
    assert [(line["stage"], line["user"]) for line in lines] == [
        ("start", "alice"),
        ("start", "bob"),
        ("end", "bob"),
        ("end", "alice"),
    ]
    end = lines[3]
    assert (end["audit"], end["stage"]) == ("session", "end")
    expected = {
        "user": "alice",
        "groups": ["devs", "ops", "system:authenticated"],
        "kind": "Machine",
        "namespace": "default",
        "name": "vm1",
        "subresource": "console",
        "mode": "writer",
        "dialect": V5,
        "client": "127.0.0.1",
        "requestID": "request-42",
        "bytesUp": 5,
        "bytesDown": 5,
        "code": 1000,
        "endedBy": "client",
    }
    assert {k: end[k] for k in expected} == expected
    assert end["start"] < end["end"] and end["start"].endswith("Z")
    assert lines[0]["end"] is None and lines[0]["session"] == end["session"]
    assert lines[2]["mode"] == "observer" and lines[2]["bytesDown"] == 5


def with_uid(obj: dict[str, Any], uid: str) -> dict[str, Any]:
    obj["metadata"]["uid"] = uid
    return obj


async def console_session(port: int, ctx: Any, token: str, *, sub: str = "console") -> None:
    url = f"wss://127.0.0.1:{port}/apis/{GROUP_VERSION}/namespaces/default/machines/vm/{sub}"
    async with websockets.connect(
        url,
        ssl=ctx,
        additional_headers={"Authorization": f"Bearer {token}"},
        subprotocols=[websockets.Subprotocol(V5)],
    ) as ws:
        assert await asyncio.wait_for(ws.recv(), 5) == b"\x01"  # the session is up
        if sub == "console":
            await ws.send(b"\x00ping")
            assert await asyncio.wait_for(ws.recv(), 5) == b"\x01ping"


async def test_events_on_the_machine_say_who_opened_and_closed_it(
    tmp_path: Path, backend: Backend
) -> None:
    async with cluster(tmp_path) as (fake, server):
        fake.allow = lambda spec: True
        await fake.put(with_uid(machine("vm", console=backend.url), "uid-vm"))
        await wait_for(lambda: server.state.caches["machines"].get("default", "vm") is not None)
        await console_session(server.port, client_ssl(tmp_path), "alice-token")
        await fake.wait(lambda: len(fake.events) == 2)
    opened, closed = fake.events
    assert (opened["reason"], opened["message"]) == ("ConsoleOpened", "Console opened by alice")
    assert closed["reason"] == "ConsoleClosed"
    assert closed["message"].startswith("Console of alice closed after 0s (8 B)")
    involved = opened["involvedObject"]
    assert involved.pop("resourceVersion")
    assert involved == {
        "apiVersion": "subres.dev/v1alpha1",
        "kind": "Machine",
        "name": "vm",
        "namespace": "default",
        "uid": "uid-vm",
    }
    assert opened["metadata"]["namespace"] == "default"
    assert (opened["type"], opened["source"]) == ("Normal", {"component": "subres"})


async def test_usbredir_events_name_the_slot(tmp_path: Path, backend: Backend) -> None:
    async with cluster(tmp_path) as (fake, server):
        fake.allow = lambda spec: True
        status = {"usbredir": {"endpoints": [backend.url]}}
        await fake.put(with_uid(machine("vm", status=status), "uid-vm"))
        await wait_for(lambda: server.state.caches["machines"].get("default", "vm") is not None)
        url = f"wss://127.0.0.1:{server.port}/apis/{GROUP_VERSION}/namespaces/default/machines/vm"
        async with websockets.connect(
            f"{url}/usbredir",
            ssl=client_ssl(tmp_path),
            additional_headers={"Authorization": "Bearer alice-token"},
        ) as ws:
            await ws.send(b"usb")
            assert await asyncio.wait_for(ws.recv(), 5) == b"usb"
        await fake.wait(lambda: len(fake.events) == 2)
    opened, closed = fake.events
    assert (opened["reason"], opened["message"]) == (
        "USBRedirOpened",
        "USB redirection slot 0 opened by alice",
    )
    assert closed["reason"] == "USBRedirClosed"
    assert closed["message"].startswith("USB redirection slot 0 of alice closed after 0s (6 B)")


async def test_refused_events_never_break_a_session(tmp_path: Path, backend: Backend) -> None:
    async with cluster(tmp_path) as (fake, server):
        fake.allow = lambda spec: True
        fake.event_error = 403
        await fake.put(with_uid(machine("vm", console=backend.url), "uid-vm"))
        await wait_for(lambda: server.state.caches["machines"].get("default", "vm") is not None)
        await console_session(server.port, client_ssl(tmp_path), "alice-token")
        await console_session(
            server.port, client_ssl(tmp_path), "alice-token", sub="console-observe"
        )
        metrics = server.state.metrics
        await wait_for(lambda: sample(metrics, "subres_events_failed_total") == 4)
    assert fake.calls["event"] == 4 and fake.events == []


class CountingApi:
    """Stands in for `kube.client.Api`: takes Events, or holds them until released."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.release = asyncio.Event()
        self.release.set()

    async def create_event(
        self, namespace: str, body: dict[str, Any], *, request_timeout: float
    ) -> dict[str, Any]:
        await self.release.wait()
        self.bodies.append(body)
        return body


def parent(name: str) -> Mapping[str, Any]:
    return {
        "apiVersion": "subres.dev/v1alpha1",
        "kind": "Machine",
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
    }


def sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


async def test_events_are_limited_per_object_and_overall() -> None:
    api, metrics = CountingApi(), Metrics()
    events = KubeEvents(api, metrics=metrics, settings=EventSettings(burst=3, queue=4))
    for _ in range(5):
        events.emit(parent("busy"), reason="ConsoleOpened", message="m")
    events.emit(parent("quiet"), reason="ConsoleOpened", message="m")
    await events.close()
    names = [b["involvedObject"]["name"] for b in api.bodies]
    assert names == ["busy", "busy", "busy", "quiet"]
    assert sample(metrics, "subres_events_dropped_total", reason="rate") == 2
    api.release.clear()
    held = KubeEvents(api, metrics=metrics, settings=EventSettings(queue=2, close_grace=0.1))
    for name in ("a", "b", "c", "d"):
        held.emit(parent(name), reason="ConsoleOpened", message="m")
    await held.close()
    assert sample(metrics, "subres_events_dropped_total", reason="queue") == 2


def test_a_broken_audit_stream_never_reaches_the_session(caplog: pytest.LogCaptureFixture) -> None:
    stream = io.StringIO()
    audit = SessionAudit(stream)
    fields = {"user": "alice", "start": 1.5, "end": None}
    audit.started(fields)
    audit.close()  # the writer thread has written what waited
    assert json.loads(stream.getvalue())["start"] == "1970-01-01T00:00:01.500000Z"
    stream.close()
    audit.ended(fields)
    audit.ended(fields)
    audit.close()
    assert [r.message for r in caplog.records] == [
        "cannot write session audit lines: I/O operation on closed file"
    ]


class Stuck(io.StringIO):
    """A stream that blocks every write until released, as a full pipe nobody reads."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def write(self, text: str) -> int:
        self.release.wait(10)
        return super().write(text)


def test_a_stream_that_blocks_holds_nobody_up(caplog: pytest.LogCaptureFixture) -> None:
    stream = Stuck()
    audit = SessionAudit(stream)
    for _ in range(MAX_PENDING + 5):
        audit.started({"user": "alice", "start": 1.0, "end": None})  # returns at once
    assert 4 <= audit.dropped <= 5  # one line may already be in the writer's hands
    assert caplog.records[0].message.startswith("session audit lines dropped")
    stream.release.set()
    audit.close()


def test_the_audit_log_flag_names_stdout_a_file_or_nothing(tmp_path: Path) -> None:
    assert audit.open_log("-") is sys.stdout
    assert audit.open_log("") is None
    stream = audit.open_log(str(tmp_path / "a.jsonl"))
    assert stream is not None
    stream.close()
