"""Answers of other replicas are read whole, or not used: never cut short and served as whole.

Two real replicas (`tests.server.replicas`); the other replica's peer answer
to the sessions list (`GET /peer/v1/sessions`) is replaced by one that
arrives in many pieces, one cut short, or one that is not a listing. The
replica asked must list every session of a whole answer, and must leave out,
log, count and name (Warning) a cut or unparsable one. A recording the
other replica sends cut short is answered 503, never 200 with part of it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from subres.server import recordinglist, sessionlist
from subres.server.state import State
from tests.server.replicas import as_user, replicas, url
from tests.support import Backend

SESSIONS = 600
"""Sessions the other replica lists: about 300 KB, far more than one read of a socket."""
PIECE = 16 << 10

Answer = Callable[[State, web.Request], Awaitable[web.StreamResponse]]


def _listing() -> bytes:
    items = [
        {
            "kind": "Session",
            "metadata": {"name": f"vm-console-{i:08x}", "namespace": "default"},
            "parent": {"kind": "Machine", "name": "vm"},
            "subresource": "console",
            "mode": "observer",
            "user": f"user-{i}",
            "since": "2026-12-06T05:00:00Z",
            "padding": "x" * 400,
        }
        for i in range(SESSIONS)
    ]
    return json.dumps({"items": items}).encode()


async def _in_pieces(state: State, request: web.Request) -> web.StreamResponse:
    body = _listing()
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    response.content_length = len(body)
    await response.prepare(request)
    for start in range(0, len(body), PIECE):
        await response.write(body[start : start + PIECE])
        await asyncio.sleep(0.005)  # pacing, so that the answer arrives in pieces
    await response.write_eof()
    return response


async def _cut_short(state: State, request: web.Request) -> web.StreamResponse:
    body = _listing()
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    response.content_length = len(body)
    await response.prepare(request)
    await response.write(body[: len(body) // 3])
    assert request.transport is not None
    request.transport.close()  # as a replica that dies, or a connection cut, mid-answer
    return response


async def _not_a_listing(state: State, request: web.Request) -> web.StreamResponse:
    return web.Response(body=b'{"items": "no"}', content_type="application/json")


async def _list_through_the_first(
    tmp_path: Path, backend: Backend, monkeypatch: pytest.MonkeyPatch, answer: Answer
) -> tuple[dict[str, Any], str | None, dict[str, float]]:
    """The sessions list of `vm` asked of the first replica, while the other answers with
    `answer`: the listing, its Warning and the first replica's failed-answer counts."""
    monkeypatch.setattr(sessionlist, "fronted", answer)
    async with replicas(tmp_path, backend) as (_, servers), aiohttp.ClientSession() as http:
        asked = servers[0]
        sessions = url(asked, "sessions").replace("wss://", "https://")
        async with http.get(sessions, **as_user(tmp_path, "bob")) as r:
            assert r.status == 200
            listing, warning = await r.json(), r.headers.get("Warning")
        registry = asked.state.metrics.registry
        counted = {
            reason: registry.get_sample_value(
                "subres_peer_answers_failed_total", {"reason": reason}
            )
            or 0.0
            for reason in ("cut", "unparsable", "unreachable")
        }
    return listing, warning, counted


async def test_an_answer_in_many_pieces_is_read_whole(
    tmp_path: Path, backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    listing, warning, counted = await _list_through_the_first(
        tmp_path, backend, monkeypatch, _in_pieces
    )
    assert warning is None
    assert len(listing["items"]) == SESSIONS
    assert not any(counted.values()), counted


async def test_a_cut_answer_is_left_out_logged_counted_and_named(
    tmp_path: Path,
    backend: Backend,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="subres.server.fanout")
    listing, warning, counted = await _list_through_the_first(
        tmp_path, backend, monkeypatch, _cut_short
    )
    assert listing["items"] == []
    assert warning is not None and "replica-b" in warning
    assert counted == {"cut": 1.0, "unparsable": 0.0, "unreachable": 0.0}
    [logged] = [r.getMessage() for r in caplog.records if "replica-b" in r.getMessage()]
    assert "cut short" in logged, logged


async def test_an_answer_that_is_no_listing_is_left_out_logged_counted_and_named(
    tmp_path: Path,
    backend: Backend,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="subres.server.fanout")
    listing, warning, counted = await _list_through_the_first(
        tmp_path, backend, monkeypatch, _not_a_listing
    )
    assert listing["items"] == []
    assert warning is not None and "replica-b" in warning
    assert counted == {"cut": 0.0, "unparsable": 1.0, "unreachable": 0.0}
    assert any("no listing" in r.getMessage() for r in caplog.records), caplog.records


async def test_a_recording_cut_short_by_the_replica_that_has_it_is_never_served(
    tmp_path: Path, backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    local_one = recordinglist.local_one

    async def cut_when_asked_by_a_peer(state: State, request: web.Request) -> web.StreamResponse:
        if request.path.startswith("/peer/"):
            return await _cut_short(state, request)
        return await local_one(state, request)  # here: no such file, 404

    monkeypatch.setattr(recordinglist, "local_one", cut_when_asked_by_a_peer)
    async with replicas(tmp_path, backend) as (_, servers), aiohttp.ClientSession() as http:
        asked = servers[0]
        name = "20261206T050000Z-0123456789abcdef.cast"
        recording = url(asked, f"recordings/{name}").replace("wss://", "https://")
        async with http.get(recording, **as_user(tmp_path, "auditor")) as r:
            status, text = r.status, await r.text()
        cut = asked.state.metrics.registry.get_sample_value(
            "subres_peer_answers_failed_total", {"reason": "cut"}
        )
    assert status == 503, text[:300]
    assert "replica-b (" in text and "cut short" in text, text
    assert cut == 1.0
