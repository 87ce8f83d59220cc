"""Every number a client writes in a query or a path answers a Status, however long it is.

Python refuses to convert more than 4,300 digits with a ValueError: a
`?tail=`, a port in `?ports=` or in the path, each spelled with thousands
of digits, or with digits of another script, must still be a 400 Status.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from subres.auth import user
from subres.auth.user import UserInfo
from subres.kube.status import StatusError
from subres.sessions import peer
from tests.support import Backend, Standalone, machine, start_standalone

HUGE = "9" * 5000
"""More digits than Python converts."""


@pytest.fixture
async def subres(tmp_path: Path, echo: Backend) -> AsyncIterator[Standalone]:
    vm = machine("vm1", console=echo.url)
    vm["status"]["portForward"] = {"address": "127.0.0.1", "ports": [22]}
    async with start_standalone(tmp_path, vm) as s:
        yield s


@pytest.mark.parametrize(
    ("sub", "query", "message"),
    [
        ("console", f"?tail={HUGE}", "tail must be at most 2147483647 lines"),
        ("console-observe", f"?tail={HUGE}", "tail must be at most 2147483647 lines"),
        ("console", "?tail=" + "0" * 5000 + "1", ""),  # zeros say nothing: one line
        ("console", "?tail=%D9%A3", "tail must be a number of lines"),  # an Arabic-Indic 3
        ("portforward", f"?ports={HUGE}", "out of range"),
        ("portforward", f"?ports=22,{HUGE}", "out of range"),
        (f"portforward/{HUGE}", "", "invalid port"),
        (f"portforward/{HUGE}/tcp", "", "invalid port"),
    ],
)
async def test_numbers_of_any_length_are_a_status(
    subres: Standalone, sub: str, query: str, message: str
) -> None:
    url = subres.url("vm1", sub) + query
    if not message:
        async with subres.websocket(url):
            return
    protocols = ["v4.channel.k8s.io"] if "ports" in query else []
    code, status = await subres.refused(url, *protocols)
    assert code == 400
    assert message in status["message"]


async def test_a_huge_number_in_the_sessions_query_or_a_plain_get_is_a_status(
    subres: Standalone,
) -> None:
    async with aiohttp.ClientSession() as http:
        for path in (f"sessions?watch={HUGE}", f"machines/vm1/console?tail={HUGE}"):
            url = subres.api_url(path, scheme="https")
            async with http.get(url, headers=subres.auth, ssl=subres.client_ssl) as answer:
                body = await answer.json()
            assert body["kind"] == "Status", path
            assert answer.status == body["code"] and answer.status in (400, 405), (path, body)


@pytest.mark.parametrize(("tail", "lines"), [("12", 12), ("0" * 5000 + "3", 3)])
def test_a_peer_sessions_tail_is_read_as_the_fronts(tail: str, lines: int) -> None:
    one = {
        "Subres-Unit": "machines/console/default/vm1",
        "Subres-Mode": "observer",
        "Subres-User": user.encode(UserInfo("alice")),
    }
    assert peer.parse({**one, "Subres-Tail": tail}).tail == lines
    for bad in (HUGE, "-1", "x", "\u0663"):
        with pytest.raises(StatusError) as refused:
            peer.parse({**one, "Subres-Tail": bad})
        assert refused.value.code == 400
