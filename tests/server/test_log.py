"""`log`: a kept console's output read as pods/log reads a container's.

The console is an echo backend that prints what the test tells it to; the
keeper keeps it, and every read goes through the real application over TLS.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from subres.protocol import consolelog
from tests.consoles import Console
from tests.support import Backend, Standalone, machine, start_standalone, wait_for

KEEP = {"subres.dev/keep-console": "true"}
TIMEOUT = 10.0
STAMP = rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z "


@pytest.fixture
async def subres(tmp_path: Path, serial: Backend) -> AsyncIterator[Standalone]:
    async with start_standalone(
        tmp_path,
        machine("vm1", console=serial.url, annotations=KEEP),
        machine("plain", console=serial.url),
    ) as s:
        await serial.wait_open(1)  # kept from the start
        yield s


async def get(subres: Standalone, name: str, query: str = "") -> tuple[int, str, bytes]:
    return await subres.fetch(subres.url(name, "log", scheme="https") + query)


async def logged(subres: Standalone, text: bytes, query: str = "") -> bytes:
    """The log once it holds `text` (the keeper delivers output a moment after it is printed)."""
    async with asyncio.timeout(5):
        while True:
            status, _, body = await get(subres, "vm1", query)
            assert status == 200, body
            if text in body:
                return body
            await asyncio.sleep(0.02)  # nothing signals a delivery to a client of the log


async def test_the_log_is_what_the_console_printed_controls_and_all(
    subres: Standalone, console: Console
) -> None:
    printed = b"boot: ok\r\n\x1b[1mlogin:\x1b[0m \x07\r\nlast line, unfinished"
    await console.say(printed)
    assert await logged(subres, b"unfinished") == printed
    status, kind, body = await get(subres, "vm1", "?tailLines=2")
    assert (status, kind, body) == (
        200,
        "text/plain; charset=utf-8",
        b"\x1b[1mlogin:\x1b[0m \x07\r\nlast line, unfinished",
    )
    assert (await get(subres, "vm1", "?limitBytes=4"))[2] == b"boot"
    assert (await get(subres, "vm1", "?tailLines=0"))[2] == b""


async def test_timestamps_are_the_keepers_and_since_time_cuts_by_them(
    subres: Standalone, console: Console
) -> None:
    await console.say(b"first\n")
    first = await logged(subres, b"first\n", "?timestamps=true")
    assert re.fullmatch(STAMP + rb"first\n", first), first
    await console.say(b"second\n")
    both = await logged(subres, b"second\n", "?timestamps=true")
    stamps = re.findall(rb"^(\S+) ", both, re.MULTILINE)
    assert len(stamps) == 2 and stamps[0] <= stamps[1]
    # One nanosecond after the first line began: only the second is left, if it began later.
    began = consolelog.parse({"sinceTime": stamps[0].decode()}, now_ns=0).since_ns
    assert began is not None
    later = consolelog.stamp(began + 1).decode().strip()
    status, _, body = await get(subres, "vm1", f"?sinceTime={later}")
    assert status == 200 and body in (b"second\n", b"first\nsecond\n")
    if stamps[0] != stamps[1]:
        assert body == b"second\n"


async def test_follow_streams_new_output_until_the_console_is_let_go(
    subres: Standalone, console: Console
) -> None:
    await console.say(b"before\n")
    await logged(subres, b"before\n")
    async with (
        aiohttp.ClientSession() as http,
        http.get(
            subres.url("vm1", "log", scheme="https") + "?follow=true&tailLines=1",
            ssl=subres.client_ssl,
            headers=subres.auth,
        ) as response,
    ):
        assert response.status == 200 and response.headers["Transfer-Encoding"] == "chunked"
        assert await read_until(response, b"before\n") == b"before\n"
        await console.say(b"after\n")
        assert await read_until(response, b"after\n") == b"after\n"
        # The machine stops opting in: the keeper lets the console go, and the log ends.
        subres.write_machines(machine("vm1", console=console_url(subres)))
        async with asyncio.timeout(TIMEOUT):
            assert await response.content.read() == b""


async def test_previous_is_the_output_before_the_console_was_dialed_again(
    subres: Standalone, serial: Backend, console: Console
) -> None:
    status, _, body = await get(subres, "vm1", "?previous=true")
    assert status == 400 and b"has had no previous connection" in body
    await console.say(b"first boot\n")
    await logged(subres, b"first boot\n")
    for writer in list(console.writers):
        writer.close()  # the machine resets its console: the keeper dials again
    await wait_for(lambda: serial.accepted == 2 and serial.open == 1)
    await console.say(b"second boot\n")
    assert await logged(subres, b"second boot\n") == b"second boot\n"
    assert (await get(subres, "vm1", "?previous=1"))[2] == b"first boot\n"


@pytest.mark.parametrize(
    ("query", "words"),
    [
        ("?tailLines=-1", "tailLines must be a whole number of at least 0"),
        ("?sinceSeconds=0", "sinceSeconds must be a whole number of at least 1"),
        ("?limitBytes=" + "9" * 40, "limitBytes must be a whole number"),
        ("?follow=yes", "follow must be true or false"),
        ("?sinceSeconds=5&sinceTime=2024-05-01T10:02:03Z", "at most one of sinceTime"),
        ("?sinceTime=yesterday", "sinceTime must be an RFC 3339 time"),
    ],
)
async def test_bad_options_are_a_status(subres: Standalone, query: str, words: str) -> None:
    status, kind, body = await get(subres, "vm1", query)
    assert (status, kind) == (400, "application/json") and words.encode() in body, body


async def test_a_console_not_kept_says_how_to_keep_it(subres: Standalone) -> None:
    """Where the object lives: in the standalone file, or in the cluster (kubectl annotate)."""
    status, _, body = await get(subres, "plain")
    where = subres.server.state.parents_file
    assert status == 400 and where is not None
    said = (
        b"Machine default/plain: the console is not kept, so it has no log; keep it with the "
        b'annotation subres.dev/keep-console=\\"true\\" '
    )
    assert said + f"(in {where}, under its metadata.annotations; ".encode() in body, body
    subres.server.state.parents_file = None
    status, _, body = await get(subres, "plain")
    annotate = b"kubectl annotate machines.subres.dev plain -n default subres.dev/keep-console=true"
    assert said + b"(" + annotate + b")" in body, body


async def test_a_kind_that_never_keeps_says_so(tmp_path: Path, serial: Backend) -> None:
    never = _machines({"endpoint": ".status.console.endpoint", "keep": "never"})
    async with start_standalone(
        tmp_path, machine("vm1", console=serial.url, annotations=KEEP), config=never
    ) as subres:
        status, _, body = await get(subres, "vm1")
    assert status == 400 and b"machines never keep their console (console.keep: never" in body


async def test_a_follower_ends_when_the_server_stops(tmp_path: Path, serial: Backend) -> None:
    async with start_standalone(
        tmp_path, machine("vm1", console=serial.url, annotations=KEEP)
    ) as subres:
        await serial.wait_open(1)
        http = aiohttp.ClientSession()
        response = await http.get(
            subres.url("vm1", "log", scheme="https") + "?follow=true",
            ssl=subres.client_ssl,
            headers=subres.auth,
        )
    try:
        async with asyncio.timeout(TIMEOUT):
            assert await response.content.read() == b""
    finally:
        response.release()
        await http.close()


def console_url(subres: Standalone) -> str:
    cached = subres.server.state.caches["machines"].get("default", "vm1")
    assert cached is not None
    return str(cached["status"]["console"]["endpoint"])


async def read_until(response: aiohttp.ClientResponse, text: bytes) -> bytes:
    got = b""
    async with asyncio.timeout(TIMEOUT):
        while not got.endswith(text):
            chunk = await response.content.readany()
            assert chunk, got
            got += chunk
    return got


def _machines(console: dict[str, Any]) -> dict[str, Any]:
    return {
        "parents": [
            {
                "resource": "machines",
                "kind": "Machine",
                "source": {"group": "subres.dev", "version": "v1alpha1", "resource": "machines"},
                "subresources": {"console": console},
            }
        ]
    }
