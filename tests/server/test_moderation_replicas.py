"""Moderation and limits across replicas: the writer, the moderator and the one who ends it may
each reach a different replica (the owner of the console holds the gate), and a user's sessions
are counted on every replica.

Two real cluster-mode replicas (`tests.server.replicas`); users arrive as
kube-apiserver's front proxy says, mia with the group `sre-leads`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.server.replicas import as_user, owner_and_other, replicas, url
from tests.support import Backend

POLICY = {"moderation": [{"name": "all", "moderators": {"groups": ["sre-leads"]}}]}
WAITING = b"waiting for 1 moderator (a member of sre-leads) to watch"


def as_moderator(tmp: Path) -> dict[str, Any]:
    found = as_user(tmp, "mia")
    found["headers"] = {**found["headers"], "X-Remote-Group": "sre-leads"}
    return found


async def until(ws: aiohttp.ClientWebSocketResponse, text: bytes) -> bytes:
    seen = b""
    while text not in seen:
        seen += await ws.receive_bytes(timeout=10)
    return seen


async def test_a_writer_on_one_replica_waits_for_a_moderator_on_the_other_who_ends_it(
    tmp_path: Path, backend: Backend
) -> None:
    async with (
        replicas(tmp_path, backend, config=lambda _: POLICY) as (_, servers),
        aiohttp.ClientSession() as http,
    ):
        owner, other = owner_and_other(servers)
        async with http.ws_connect(url(other, "console"), **as_user(tmp_path, "alice")) as alice:
            await until(alice, WAITING)
            await alice.send_bytes(b"dropped")
            async with http.ws_connect(url(owner, "console-moderate"), **as_moderator(tmp_path)):
                await until(alice, b"mia moderating; the session starts")
                await alice.send_bytes(b"echoed")
                assert await until(alice, b"echoed") == b"echoed"
                ending = url(other, "console-moderate").replace("wss://", "https://")
                async with http.delete(ending, **as_moderator(tmp_path)) as answer:
                    assert answer.status == 200, await answer.text()
                closing = await alice.receive(timeout=10)
                assert (closing.type, closing.data, closing.extra) == (
                    aiohttp.WSMsgType.CLOSE,
                    4006,
                    "ended by the moderator mia",
                )


async def test_max_sessions_per_user_counts_the_sessions_other_replicas_front(
    tmp_path: Path, backend: Backend
) -> None:
    rule = {"name": "one", "subresources": ["console", "console-observe"], "maxSessionsPerUser": 1}
    async with (
        replicas(tmp_path, backend, config=lambda _: {"limits": [rule]}) as (_, servers),
        aiohttp.ClientSession() as http,
    ):
        first, second = servers
        async with http.ws_connect(url(first, "console-observe"), **as_user(tmp_path, "alice")):
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await http.ws_connect(url(second, "console"), **as_user(tmp_path, "alice"))
            assert refused.value.status == 429
            async with http.ws_connect(url(second, "console"), **as_user(tmp_path, "bob")) as bob:
                await bob.send_bytes(b"bob may")
                assert await until(bob, b"bob may") == b"bob may"
