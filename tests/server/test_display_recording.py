"""Display recordings: a recorded vnc session's framebuffer, from subres's own view-only connection.

The display is the demo's real RFB server (a clock this test moves on); the
viewer is a WebSocket RFB client. The recording is read back through the
API and replayed with `protocol.displayrec`: its last frame is what the
display showed, its markers say who came and went, and no byte a viewer
sent is in it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from subres.demo.vnc import Display, VncServer
from subres.protocol import displayrec
from tests.server.test_recordings import api
from tests.server.test_vnc import vnc_machine
from tests.server.test_vnc_shared import KEY, Viewer
from tests.support import Standalone, start_standalone, wait_for

RECORD = {"subres.dev/record-display": "true"}
WAIT = 20.0


class Clock:
    """The text the demo display's clock shows, moved on by the test."""

    def __init__(self) -> None:
        self.text = "12:00:00"

    def __call__(self) -> str:
        return self.text


def recorded(name: str, endpoint: str) -> dict[str, Any]:
    obj = vnc_machine(name, endpoint)
    obj["metadata"]["annotations"] = dict(RECORD)
    return obj


def settings(tmp: Path) -> dict[str, Any]:
    return {"consoles": {"recordings": {"directory": str(tmp / "recordings")}}}


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def display(tmp_path: Path, clock: Clock) -> AsyncIterator[VncServer]:
    server = VncServer(tmp_path / "vnc.sock", display=Display(clock=clock))
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def subres(tmp_path: Path, display: VncServer) -> AsyncIterator[Standalone]:
    async with start_standalone(
        tmp_path, recorded("vm1", f"unix://{display.path}"), config=settings(tmp_path)
    ) as s:
        yield s


def replay(data: bytes) -> tuple[displayrec.Screen, list[displayrec.Record]]:
    """The screen at the end of a recording, and all its records."""
    _, offset = displayrec.read_header(data)
    screen, seen = displayrec.Screen(), []
    for ref in displayrec.blocks(data, offset):
        for record in displayrec.records(data[ref.offset : ref.offset + ref.length]):
            screen.apply(record)
            seen.append(record)
    return screen, seen


def on_disk(tmp: Path) -> bytes:
    files = sorted((tmp / "recordings" / "default" / "machines" / "vm1").rglob("*.display"))
    return files[-1].read_bytes() if files else b""


async def until(predicate: Any) -> None:
    async with asyncio.timeout(WAIT):
        while not predicate():  # noqa: ASYNC110 - a file nothing signals
            await asyncio.sleep(0.05)


async def test_a_recorded_display_replays_what_it_showed_and_who_watched(
    tmp_path: Path, subres: Standalone, display: VncServer, clock: Clock
) -> None:
    async with (
        subres.websocket(subres.url("vm1", "vnc"), "binary") as alice,
        subres.websocket(subres.url("vm1", "vnc-observe"), "binary", user="bob") as bob,
    ):
        await Viewer(alice).hello(shared=True)
        await Viewer(bob).hello(shared=True)
        await alice.send(KEY)
        first = bytes(display.display.rgb)
        await until(
            lambda: replay(on_disk(tmp_path))[0].rgb == first if on_disk(tmp_path) else False
        )
        clock.text = "12:34:56"
        display.display.tick()
        assert display.display.rgb != first
        await until(lambda: replay(on_disk(tmp_path))[0].rgb == display.display.rgb)
    await wait_for(lambda: not subres.server.state.sessions.live)
    status, _, body = await api(subres, "vm1/recordings")
    (item,) = json.loads(body)["items"]
    assert (status, item["subresource"], item["title"]) == (200, "vnc", "Machine default/vm1 vnc")
    status, content_type, data = await api(subres, f"vm1/recordings/{item['name']}")
    assert (status, content_type) == (200, "application/vnd.subres.display-recording")
    screen, seen = replay(data)
    assert (screen.width, screen.height) == (display.display.width, display.display.height)
    assert screen.rgb == display.display.rgb
    marks = [r.text for r in seen if isinstance(r, displayrec.Mark)]
    assert marks == [
        "alice (viewer) attached",
        "bob (observer) attached",
        "bob (observer) left",
        "alice (viewer) left",
    ]
    assert isinstance(seen[-1], displayrec.End)
    frames = [r for r in seen if isinstance(r, displayrec.Frame)]
    rects = [r for r in seen if isinstance(r, displayrec.Rect)]
    assert frames and rects, "a whole frame, then what changed"
    # The clock's area alone changed: the recording did not repeat the screen.
    x, y, w, h = display.display.clock_area
    assert all(
        x <= r.x and r.x + r.width <= x + w and y <= r.y and r.y + r.height <= y + h for r in rects
    )


async def test_a_display_that_cannot_be_watched_is_refused_when_required(
    tmp_path: Path,
) -> None:
    async def vnc_auth_only(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"RFB 003.008\n")
        await reader.read(12)
        writer.write(b"\x01\x02")  # VNC Authentication only: the recorder cannot log in
        await reader.read(1)

    server = await asyncio.start_server(vnc_auth_only, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    vnc = {"endpoint": ".status.vnc.endpoint", "record": "required"}
    machines = {
        "resource": "machines",
        "kind": "Machine",
        "source": {"group": "subres.dev", "version": "v1alpha1", "resource": "machines"},
        "subresources": {"vnc": vnc},
    }
    config = {"parents": [machines], **settings(tmp_path)}
    try:
        async with start_standalone(
            tmp_path, vnc_machine("vm1", f"tcp://127.0.0.1:{port}"), config=config
        ) as subres:
            status, body = await subres.refused(subres.url("vm1", "vnc"), "binary")
            assert subres.server.state.sessions.live == set()
    finally:
        server.close()
    assert status == 503
    assert body["message"].startswith(
        "Machine default/vm1 vnc is served only while recorded (record: required), "
        "and its recording cannot start: cannot watch the display: the VNC server requires "
        "authentication"
    )
