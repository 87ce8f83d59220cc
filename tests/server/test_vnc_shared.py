"""Shared displays: an interactive viewer and any number of view-only ones, each its own connection.

A recording VNC server shows exactly what each viewer's connection carried
(shared ClientInit, a view-only viewer's input gone); TigerVNC shows that a
viewer asking for an exclusive session no longer disconnects the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import websockets
from websockets.asyncio.client import ClientConnection

from tests.consoles import closed
from tests.server.test_screenshot import xvnc, xvnc_available
from tests.server.test_vnc import vnc_machine
from tests.support import Standalone, start_standalone, wait_for

TIMEOUT = 10.0
V38 = b"RFB 003.008\n"
KEY = b"\x04\x01\x00\x00" + struct.pack(">I", 0x61)
POINTER = b"\x05\x01" + struct.pack(">HH", 10, 20)
UPDATE_REQUEST = b"\x03\x00" + struct.pack(">HHHH", 0, 0, 64, 48)
PIXEL_FORMAT = struct.pack(">BBBBHHHBBBxxx", 32, 24, 0, 1, 255, 255, 255, 16, 8, 0)


class RecordingVnc:
    """A VNC server (RFB 3.8, security None) keeping what each connection sent after ServerInit."""

    def __init__(self) -> None:
        self.inits: list[int] = []
        self.received: list[bytearray] = []
        self.changed = asyncio.Condition()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(V38)
        await reader.readexactly(12)
        writer.write(b"\x01\x01")  # one security type: None
        await reader.readexactly(1)
        writer.write(struct.pack(">I", 0))
        (shared,) = await reader.readexactly(1)
        name = b"recording"
        writer.write(
            struct.pack(">HH", 64, 48) + PIXEL_FORMAT + struct.pack(">I", len(name)) + name
        )
        got = bytearray()
        async with self.changed:
            self.inits.append(shared)
            self.received.append(got)
            self.changed.notify_all()
        while data := await reader.read(65536):
            async with self.changed:
                got += data
                self.changed.notify_all()

    async def wait(self, predicate: object) -> None:
        async with asyncio.timeout(TIMEOUT), self.changed:
            await self.changed.wait_for(predicate)  # type: ignore[arg-type]


class Viewer:
    """An RFB client over a subres WebSocket, as noVNC or virtctl would speak it."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.buffer = bytearray()

    async def read(self, size: int) -> bytes:
        async with asyncio.timeout(TIMEOUT):
            while len(self.buffer) < size:
                message = await self.ws.recv()
                assert isinstance(message, bytes)
                self.buffer += message
        data = bytes(self.buffer[:size])
        del self.buffer[:size]
        return data

    async def hello(self, *, shared: bool) -> str:
        """Handshake as an RFB 3.8 client with security None; the desktop name."""
        assert await self.read(12) == V38
        await self.ws.send(V38)
        count = (await self.read(1))[0]
        assert 1 in await self.read(count)
        await self.ws.send(b"\x01")
        assert await self.read(4) == bytes(4)
        await self.ws.send(b"\x01" if shared else b"\x00")
        init = await self.read(24)
        return (await self.read(struct.unpack(">I", init[20:24])[0])).decode()


@pytest.fixture
def recording() -> RecordingVnc:
    return RecordingVnc()


@pytest.fixture
async def subres(tmp_path: Path, recording: RecordingVnc) -> AsyncIterator[Standalone]:
    server = await asyncio.start_server(recording.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with start_standalone(tmp_path, vnc_machine("vm1", f"tcp://127.0.0.1:{port}")) as s:
        yield s
    server.close()


def view(
    subres: Standalone, sub: str, *, user: str = "alice", query: str = ""
) -> websockets.connect:
    return subres.websocket(subres.url("vm1", sub) + query, "binary", user=user)


async def test_view_only_input_never_reaches_the_display(
    subres: Standalone, recording: RecordingVnc
) -> None:
    async with view(subres, "vnc") as alice_ws, view(subres, "vnc-observe", user="bob") as bob_ws:
        alice, bob = Viewer(alice_ws), Viewer(bob_ws)
        assert await alice.hello(shared=False) == "recording"
        assert await bob.hello(shared=False) == "recording"
        await bob_ws.send(KEY + POINTER + UPDATE_REQUEST)
        await alice_ws.send(KEY + POINTER)
        await recording.wait(
            lambda: (
                len(recording.received) == 2
                and sorted(len(r) for r in recording.received) == [len(UPDATE_REQUEST), 14]
            )
        )
    # Both asked for an exclusive session; the display was asked to share it.
    assert recording.inits == [1, 1]
    assert sorted(bytes(r) for r in recording.received) == sorted([KEY + POINTER, UPDATE_REQUEST])


async def test_view_only_viewers_stay_through_takeovers_and_preserve_session(
    subres: Standalone,
) -> None:
    async with view(subres, "vnc-observe", user="bob") as bob_ws:
        bob = Viewer(bob_ws)
        await bob.hello(shared=True)
        # An observer holds no slot: preserveSession is free to connect.
        async with view(subres, "vnc", query="?preserveSession=true") as first_ws:
            await Viewer(first_ws).hello(shared=True)
            async with view(subres, "vnc", user="carol") as second_ws:
                await Viewer(second_ws).hello(shared=True)
                assert (await closed(first_ws))[0] == 4001
        await bob_ws.send(UPDATE_REQUEST)
        await bob_ws.ping()
        assert bob_ws.close_code is None

    def modes() -> list[str]:
        return [line["mode"] for line in subres.audit_lines() if line["stage"] == "start"]

    # Audit lines leave from a thread of their own: the last may still be on its way.
    await wait_for(lambda: len(modes()) == 3)
    assert modes() == ["observer", "viewer", "viewer"]


async def test_a_view_only_viewer_sending_what_cannot_be_checked_is_closed(
    subres: Standalone, recording: RecordingVnc
) -> None:
    async with view(subres, "vnc-observe", user="bob") as bob_ws:
        await Viewer(bob_ws).hello(shared=True)
        await bob_ws.send(b"\x63 mystery")
        assert await closed(bob_ws) == (
            1008,
            "unknown RFB message type 99 from a view-only viewer",
        )
    await wait_for(lambda: not subres.server.state.sessions.live)
    assert bytes(recording.received[0]) == b""


@pytest.mark.full  # TigerVNC: a Debian package that scripts/test installs
async def test_tigervnc_keeps_every_viewer_when_one_asks_for_the_display_alone(
    tmp_path: Path,
) -> None:
    assert xvnc_available(), "scripts/test installs tigervnc-standalone-server and x11 tools"
    with xvnc(tmp_path) as (_, socket_path):
        machine = vnc_machine("vm1", f"unix://{socket_path}")
        async with (
            start_standalone(tmp_path, machine) as subres,
            view(subres, "vnc") as alice_ws,
            view(subres, "vnc-observe", user="bob") as bob_ws,
        ):
            alice, bob = Viewer(alice_ws), Viewer(bob_ws)
            await alice.hello(shared=False)
            # Unshared, this ClientInit would make TigerVNC drop alice (-DisconnectClients).
            await bob.hello(shared=False)
            for viewer in (alice, bob):
                await viewer.ws.send(b"\x03\x00" + struct.pack(">HHHH", 0, 0, 320, 240))
                header = await viewer.read(4)
                assert header[0] == 0  # FramebufferUpdate: both are still being served


@pytest.mark.parametrize("sub", ["vnc", "vnc-observe"])
async def test_a_viewer_flooding_a_guest_stuck_before_its_security_type_is_closed(
    tmp_path: Path, sub: str
) -> None:
    # An RFB 3.3 guest that sends its version, then hangs: the guard must not keep it all.
    seen = asyncio.Event()

    async def stuck(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"RFB 003.003\n")
        await reader.readexactly(12)
        seen.set()
        await reader.read()  # nothing more ever comes through the guard

    server = await asyncio.start_server(stuck, "127.0.0.1", 0)
    url = f"tcp://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        async with (
            start_standalone(tmp_path, vnc_machine("vm1", url)) as subres,
            view(subres, sub) as ws,
        ):
            assert await Viewer(ws).read(12) == b"RFB 003.003\n"
            await ws.send(b"RFB 003.003\n")
            async with asyncio.timeout(TIMEOUT):
                await seen.wait()
            with contextlib.suppress(websockets.ConnectionClosed):
                for _ in range(64):
                    await ws.send(bytes(1 << 18))
            code, reason = await closed(ws)
            assert code == 1008
            assert reason is not None and "before the VNC server chose a security type" in reason
            await wait_for(lambda: not subres.server.state.sessions.live)
    finally:
        server.close()
