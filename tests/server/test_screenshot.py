"""The screenshot subresource against our demo display and a real TigerVNC server."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import shutil
import struct
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from PIL import Image
from websockets.asyncio.client import connect

from subres.backends import endpoint
from subres.backends.rfb import capture
from subres.backends.stream import dial
from subres.config import EndpointPolicySpec
from subres.demo.vnc import Display, VncServer
from subres.protocol import rfb
from tests.server.test_vnc import vnc_machine
from tests.support import (
    Backend,
    Standalone,
    open_fds,
    relay_to_unix,
    start_standalone,
    wait_for,
)

DEADLINE = 1.0


async def get(subres: Standalone, name: str) -> tuple[int, str, bytes]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(
            subres.url(name, "screenshot", scheme="https"),
            ssl=subres.client_ssl,
            headers=subres.auth,
            timeout=aiohttp.ClientTimeout(total=30),
        ) as response,
    ):
        return response.status, response.content_type, await response.read()


def rgb_of(png: bytes) -> tuple[tuple[int, int], bytes]:
    image = Image.open(io.BytesIO(png))
    assert image.format == "PNG" and image.mode == "RGB"
    return image.size, image.tobytes()


async def direct_capture(path: Path) -> rfb.FramebufferCaptured:
    """Our RFB client straight on the socket, no subres in between."""
    policy = EndpointPolicySpec(socket_dirs=(str(path.parent),))
    target = await endpoint.check(endpoint.parse(f"unix://{path}"), policy)
    stream = await dial(target, connect_timeout=5, read_size=65536, write_timeout=5)
    try:
        return await capture(stream, deadline=10)
    finally:
        await stream.close()


async def silent(reader: asyncio.StreamReader, _: asyncio.StreamWriter) -> None:
    await reader.read()  # accepts, never answers, until the client leaves


async def version_only(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"RFB 003.008\n")
    await reader.read()


async def needs_password(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"RFB 003.008\n")
    await reader.readexactly(12)
    writer.write(b"\x01\x02")
    await reader.read()


@pytest.fixture
async def display(tmp_path: Path) -> AsyncIterator[VncServer]:
    server = VncServer(tmp_path / "vnc.sock", display=Display(clock=lambda: "12:34:56"))
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def backends() -> AsyncIterator[dict[str, Backend]]:
    started = {
        "silent": await Backend(handler=silent).start_tcp(),
        "version": await Backend(handler=version_only).start_tcp(),
        "password": await Backend(handler=needs_password).start_tcp(),
    }
    yield started
    for backend in started.values():
        await backend.stop()


@pytest.fixture
async def subres(
    tmp_path: Path, display: VncServer, backends: dict[str, Backend]
) -> AsyncIterator[Standalone]:
    async with start_standalone(
        tmp_path,
        vnc_machine("demo", f"unix://{display.path}"),
        vnc_machine("stopped", f"unix://{display.path}", phase="Stopped"),
        vnc_machine("headless", None),
        vnc_machine("dead", "tcp://127.0.0.1:1"),
        *(vnc_machine(name, b.url) for name, b in backends.items()),
        session={"screenshotTimeout": DEADLINE},
    ) as s:
        yield s


async def test_screenshot_of_the_demo_display_is_its_framebuffer(
    subres: Standalone, display: VncServer
) -> None:
    status, content_type, body = await get(subres, "demo")
    assert (status, content_type) == (200, "image/png")
    size, rgb = rgb_of(body)
    assert size == (display.display.width, display.display.height)
    assert rgb == bytes(display.display.rgb)
    direct = await direct_capture(display.path)
    assert rgb == direct.rgb


async def test_screenshot_leaves_a_live_vnc_session_alone(
    subres: Standalone, display: VncServer
) -> None:
    async with connect(
        subres.url("demo", "vnc"), ssl=subres.client_ssl, additional_headers=subres.auth
    ) as ws:
        assert await asyncio.wait_for(ws.recv(), 5) == b"RFB 003.008\n"
        status, _, _ = await get(subres, "demo")
        assert status == 200
        await ws.send(b"RFB 003.008\n")
        assert await asyncio.wait_for(ws.recv(), 5) == b"\x01\x01"
        assert len(subres.server.state.sessions.exclusive) == 1


@pytest.mark.parametrize(
    ("name", "code", "words"),
    [
        ("nosuch", 404, 'machines.subres.dev "nosuch" not found'),
        ("stopped", 409, '"Stopped"'),
        ("headless", 400, "has no screenshot (.status.vnc.endpoint is empty)"),
        ("dead", 503, "cannot connect to tcp://127.0.0.1:1"),
        ("password", 502, "requires authentication (offers VNC Authentication (2))"),
    ],
)
async def test_refusals_are_status_objects(
    subres: Standalone, name: str, code: int, words: str
) -> None:
    status, content_type, body = await get(subres, name)
    assert (status, content_type) == (code, "application/json")
    status_object = json.loads(body)
    assert (status_object["kind"], status_object["code"]) == ("Status", code)
    assert words in status_object["message"]


@pytest.mark.parametrize(
    ("name", "phase"),
    [("silent", "RFB protocol version"), ("version", "security types")],
)
async def test_a_backend_that_never_answers_gets_504_within_the_deadline(
    subres: Standalone, backends: dict[str, Backend], name: str, phase: str
) -> None:
    started = time.monotonic()
    status, _, body = await get(subres, name)
    elapsed = time.monotonic() - started
    assert status == 504
    message = json.loads(body)["message"]
    assert f"no framebuffer within {DEADLINE:g}s (waiting for the {phase})" in message
    assert DEADLINE <= elapsed < DEADLINE + 3
    await backends[name].wait_open(0)


def xvnc_available() -> bool:
    return all(shutil.which(tool) for tool in ("Xvnc", "xsetroot", "xwd"))


@contextlib.contextmanager
def xvnc(tmp: Path) -> Iterator[tuple[str, Path]]:
    """A TigerVNC X server on a unix socket only: its X display and its RFB socket."""
    socket_path = tmp / "xvnc.sock"
    read_fd, write_fd = os.pipe()
    proc = subprocess.Popen(
        [
            "Xvnc",
            "-displayfd", str(write_fd),
            "-rfbunixpath", str(socket_path),
            "-rfbport", "-1",
            "-SecurityTypes", "None",
            "-geometry", "320x240",
            "-depth", "24",
            "-nolisten", "tcp",
        ],
        pass_fds=(write_fd,),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    os.close(write_fd)
    try:
        # Xvnc writes its display number once it accepts connections (bounded by the test timeout).
        with os.fdopen(read_fd) as ready:
            number = ready.readline().strip()
        assert number, "Xvnc exited before it was ready"
        yield f":{number}", socket_path
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def xwd_rgb(display: str) -> tuple[tuple[int, int], bytes]:
    """The root window as X itself sees it (`xwd -root`), as packed RGB."""
    dump = subprocess.run(
        ["xwd", "-root", "-silent", "-display", display],
        capture_output=True,
        check=True,
        timeout=30,
    ).stdout
    fields = struct.unpack(">25I", dump[:100])
    header_size, width, height, byte_order = fields[0], fields[4], fields[5], fields[7]
    bits_per_pixel, bytes_per_line, ncolors = fields[11], fields[12], fields[19]
    masks = fields[14:17]
    assert bits_per_pixel == 32
    data = dump[header_size + 12 * ncolors :]
    order: Any = "big" if byte_order == 1 else "little"
    rgb = bytearray()
    for y in range(height):
        for x in range(width):
            at = y * bytes_per_line + x * 4
            value = int.from_bytes(data[at : at + 4], order)
            for mask in masks:
                rgb.append((value & mask) >> ((mask & -mask).bit_length() - 1))
    return (width, height), bytes(rgb)


@pytest.mark.full  # TigerVNC: a Debian package that scripts/test installs
async def test_screenshot_of_tigervnc_matches_xwd(tmp_path: Path) -> None:
    assert xvnc_available(), "scripts/test installs tigervnc-standalone-server and x11 tools"
    with xvnc(tmp_path) as (x_display, socket_path):
        xsetroot = await asyncio.create_subprocess_exec(
            *("xsetroot", "-display", x_display, "-mod", "5", "3"),
            *("-fg", "#ff8000", "-bg", "#0040c0"),
        )
        assert await asyncio.wait_for(xsetroot.wait(), 30) == 0
        async with start_standalone(tmp_path, vnc_machine("x", f"unix://{socket_path}")) as subres:
            status, content_type, body = await get(subres, "x")
        assert (status, content_type) == (200, "image/png")
        size, rgb = rgb_of(body)
        expected_size, expected = await asyncio.to_thread(xwd_rgb, x_display)
        direct = await direct_capture(socket_path)
    assert size == expected_size == (320, 240)
    assert {rgb[i : i + 3] for i in range(0, len(rgb), 3)} == {b"\xff\x80\x00", b"\x00\x40\xc0"}
    assert rgb == expected
    assert rgb == direct.rgb


async def test_screenshots_leave_nothing_behind(
    subres: Standalone, backends: dict[str, Backend]
) -> None:
    tasks, fds = len(asyncio.all_tasks()), open_fds()
    for name in ("demo", "password", "silent", "dead", "demo"):
        await get(subres, name)
    for backend in backends.values():
        await backend.wait_open(0)
    await wait_for(lambda: len(asyncio.all_tasks()) <= tasks and open_fds() <= fds)


async def test_captures_beyond_the_limit_wait_then_get_429_without_a_dial(
    tmp_path: Path, backends: dict[str, Backend], display: VncServer
) -> None:
    async with start_standalone(
        tmp_path,
        vnc_machine("demo", f"unix://{display.path}"),
        vnc_machine("silent", backends["silent"].url),
        session={"screenshotTimeout": DEADLINE, "screenshotConcurrency": 1},
    ) as subres:
        slots = subres.server.state.screenshot_slots
        await slots.acquire()  # a capture in progress holds the only slot
        try:
            status, _, body = await get(subres, "silent")
        finally:
            slots.release()
        assert status == 429
        refusal = json.loads(body)
        assert (refusal["reason"], refusal["details"]["retryAfterSeconds"]) == (
            "TooManyRequests",
            1,
        )
        assert "1 screenshots are being captured" in refusal["message"]
        assert backends["silent"].accepted == 0
        assert (await get(subres, "demo"))[0] == 200


async def test_concurrent_screenshots_never_exceed_the_configured_captures(
    tmp_path: Path, display: VncServer
) -> None:
    most = 0

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal most
        most = max(most, relayed.open)
        await relay_to_unix(display.path, reader, writer)

    relayed = await Backend(handler=relay).start_tcp()
    try:
        async with start_standalone(
            tmp_path,
            vnc_machine("demo", relayed.url),
            session={"screenshotConcurrency": 2},
        ) as subres:
            results = await asyncio.gather(*(get(subres, "demo") for _ in range(6)))
    finally:
        await relayed.stop()
    assert [status for status, _, _ in results] == [200] * 6
    assert relayed.accepted == 6
    assert 1 <= most <= 2


async def test_framebuffers_over_the_pixel_cap_are_refused(
    tmp_path: Path, display: VncServer
) -> None:
    async with start_standalone(
        tmp_path,
        vnc_machine("demo", f"unix://{display.path}"),
        session={"screenshotMaxPixels": 640 * 400 - 1},
    ) as subres:
        status, _, body = await get(subres, "demo")
    assert status == 502
    assert "the framebuffer is 640x400, over 255999 pixels" in json.loads(body)["message"]
