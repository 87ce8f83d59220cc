"""usbredir: a machine's USB slots, one client each, relayed byte for byte.

Each slot's backend is an echo server of its own, so the bytes a client gets
back say which slot it reached. The real QEMU usb-redir device answers in
tests/examples/test_qemu_vm.py, and virtctl in tests/cli/test_virtctl.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from websockets.asyncio.client import ClientConnection

from tests.consoles import closed
from tests.server.test_consoles import get_json, tagged
from tests.support import Backend, machine, start_standalone, wait_for

TIMEOUT = 10.0
KUBEVIRT = "plain.kubevirt.io"


class Slots:
    """Echo backends, one per slot, each telling which slot it is in its answers."""

    def __init__(self) -> None:
        self.backends: list[Backend] = []

    async def start(self, count: int) -> list[str]:
        for index in range(count):
            self.backends.append(
                await Backend(handler=tagged(f"slot{index}:".encode())).start_tcp()
            )
        return [b.url for b in self.backends]

    async def stop(self) -> None:
        await asyncio.gather(*(b.stop() for b in self.backends))


@pytest.fixture
async def slots() -> AsyncIterator[Slots]:
    s = Slots()
    yield s
    await s.stop()


def usb_machine(name: str, urls: list[str] | str | None, **extra: Any) -> dict[str, Any]:
    status = {} if urls is None else {"usbredir": {"endpoints": urls}}
    return machine(name, status=status, **extra)


async def answer(ws: ClientConnection, payload: bytes) -> bytes:
    await ws.send(payload)
    async with asyncio.timeout(TIMEOUT):
        message = await ws.recv()
    assert isinstance(message, bytes)
    return message


async def test_each_client_gets_a_free_slot_then_takes_over_the_oldest(
    tmp_path: Path, slots: Slots
) -> None:
    urls = await slots.start(2)
    async with start_standalone(tmp_path, usb_machine("vm1", urls)) as subres:
        url = subres.url("vm1", "usbredir")
        async with (
            subres.websocket(url, KUBEVIRT) as alice,
            subres.websocket(url, KUBEVIRT, user="bob") as bob,
        ):
            assert await answer(alice, b"hello") == b"slot0:hello"
            assert await answer(bob, b"hello") == b"slot1:hello"
            async with subres.websocket(url, KUBEVIRT, user="carol") as carol:
                # Every slot was held: carol takes the one held longest, alice's.
                assert await closed(alice) == (
                    4001,
                    "usbredir slot 0 of default/vm1 taken over by carol",
                )
                assert await answer(carol, b"hi") == b"slot0:hi"
                assert await answer(bob, b"still") == b"slot1:still"
                await slots.backends[0].wait_open(1)
                # Asked to preserve, a fourth client is refused before any dial.
                accepted = [b.accepted for b in slots.backends]
                code, status = await subres.refused(url + "?preserveSession=true", KUBEVIRT)
                assert code == 409, status
                assert status["message"] == (
                    "all 2 USB slots of Machine default/vm1 are in use; "
                    "connect without preserveSession=true to take one over"
                )
                assert [b.accepted for b in slots.backends] == accepted


async def test_bytes_pass_both_ways_intact(tmp_path: Path) -> None:
    echo = await Backend().start_tcp()
    payload = os.urandom(512 << 10)
    try:
        async with start_standalone(tmp_path, usb_machine("vm1", echo.url)) as subres:
            got = await subres.echoed(subres.url("vm1", "usbredir"), payload, KUBEVIRT)
    finally:
        await echo.stop()
    assert hashlib.sha256(got).hexdigest() == hashlib.sha256(payload).hexdigest()


async def test_the_cap_limits_how_many_slots_a_machine_offers(tmp_path: Path, slots: Slots) -> None:
    urls = await slots.start(3)
    parents = _machines_with({"endpoint": ".status.usbredir.endpoints", "slots": 1})
    async with start_standalone(tmp_path, usb_machine("vm1", urls), config=parents) as subres:
        url = subres.url("vm1", "usbredir")
        async with subres.websocket(url, KUBEVIRT) as alice:
            assert await answer(alice, b"a") == b"slot0:a"
            async with subres.websocket(url, KUBEVIRT, user="bob") as bob:
                assert await closed(alice) == (
                    4001,
                    "usbredir slot 0 of default/vm1 taken over by bob",
                )
                assert await answer(bob, b"b") == b"slot0:b"
    assert [b.accepted for b in slots.backends[1:]] == [0, 0]


async def test_a_template_names_each_slot(tmp_path: Path) -> None:
    backends = [
        await Backend(handler=tagged(f"slot{i}:".encode())).start_unix(tmp_path / f"vm1-usb-{i}")
        for i in (0, 1)
    ]
    parents = _machines_with({"endpoint": f"unix://{tmp_path}/{{.metadata.name}}-usb-{{slot}}"})
    try:
        async with start_standalone(tmp_path, machine("vm1"), config=parents) as subres:
            url = subres.url("vm1", "usbredir")
            async with subres.websocket(url) as a, subres.websocket(url, user="bob") as b:
                assert await answer(a, b"x") == b"slot0:x"
                assert await answer(b, b"y") == b"slot1:y"
                # The template names 4 slots (the default cap); the third has no socket.
                code, status = await subres.refused(url)
                assert code == 503 and "vm1-usb-2" in status["message"], status
    finally:
        await asyncio.gather(*(b.stop() for b in backends))


@pytest.mark.parametrize(
    ("status", "code", "words"),
    [
        (None, 400, "has no USB redirection (.status.usbredir.endpoints is empty)"),
        ([], 400, "Machine default/vm1 has no USB redirection"),
        ([3], 400, "Machine default/vm1: .status.usbredir.endpoints is not a list of URLs"),
        (["http://x"], 400, "scheme"),
        (["tcp://169.254.169.254:80"], 403, "169.254.169.254"),
    ],
)  # fmt: skip
async def test_refusals_are_a_status_and_dial_nothing(
    tmp_path: Path, status: Any, code: int, words: str
) -> None:
    async with start_standalone(tmp_path, usb_machine("vm1", status)) as subres:
        got, body = await subres.refused(subres.url("vm1", "usbredir"), KUBEVIRT)
    assert got == code and words in body["message"], body


async def test_a_stopped_machine_or_unknown_dialect_is_refused(
    tmp_path: Path, echo: Backend
) -> None:
    async with start_standalone(
        tmp_path, usb_machine("vm1", echo.url), usb_machine("off", echo.url, phase="Stopped")
    ) as subres:
        code, status = await subres.refused(subres.url("off", "usbredir"), KUBEVIRT)
        assert code == 409 and "Stopped" in status["message"]
        code, status = await subres.refused(subres.url("vm1", "usbredir"), "v5.channel.k8s.io")
        assert code == 400 and "supported: plain.kubevirt.io, binary" in status["message"]
    assert echo.accepted == 0


async def test_a_dry_run_checks_every_slot_and_dials_none(tmp_path: Path, slots: Slots) -> None:
    urls = await slots.start(2)
    machines = usb_machine("vm1", urls), usb_machine("bad", [urls[0], "tcp://169.254.169.254:1"])
    async with start_standalone(tmp_path, *machines) as subres, aiohttp.ClientSession() as http:
        answers = []
        for name in ("vm1", "bad"):
            address = subres.url(name, "usbredir", scheme="https") + "?dryRun=All"
            async with http.get(address, ssl=subres.client_ssl, headers=subres.auth) as response:
                answers.append((response.status, (await response.json())["status"]))
    assert answers == [(200, "Success"), (403, "Failure")]
    assert [b.accepted for b in slots.backends] == [0, 0]


async def test_audit_and_the_sessions_list_name_the_slot(tmp_path: Path, slots: Slots) -> None:
    urls = await slots.start(2)
    async with start_standalone(tmp_path, usb_machine("vm1", urls)) as subres:
        url = subres.url("vm1", "usbredir")
        async with subres.websocket(url) as first, subres.websocket(url, user="bob") as second:
            assert await answer(second, b"x") == b"slot1:x"
            listing = await get_json(subres, subres.url("vm1", "sessions", scheme="https"))
            held = sorted(
                (i["user"], i["subresource"], i["unit"], i["mode"]) for i in listing["items"]
            )
            assert held == [
                ("alice", "usbredir", "0", "redirector"),
                ("bob", "usbredir", "1", "redirector"),
            ]
            await first.close()
        await wait_for(lambda: len(subres.audit_lines()) == 4)
    ends = [line for line in subres.audit_lines() if line["stage"] == "end"]
    assert sorted((e["user"], e["unit"], e["mode"]) for e in ends) == [
        ("alice", "0", "redirector"),
        ("bob", "1", "redirector"),
    ]


def _machines_with(usbredir: dict[str, Any]) -> dict[str, Any]:
    running = {".status.phase": ["Running"]}
    return {
        "parents": [
            {
                "resource": "machines",
                "kind": "Machine",
                "source": {"group": "subres.dev", "version": "v1alpha1", "resource": "machines"},
                "subresources": {
                    "console": {"endpoint": ".status.console.endpoint", "require": running},
                    "usbredir": {**usbredir, "require": running},
                },
            }
        ]
    }
