"""No recording is lost when its replica is killed: SIGKILL a real `subres serve` mid-session.

A console prints a numbered line every few milliseconds; a client reads
them and notes when each arrived. Once output has flowed a while the server
gets SIGKILL. Its recording must parse whole (no half-written line) and hold
every line the client had received a second before the kill; a display's
recording must be whole blocks and end on a picture the display showed in
its last second and a quarter. A torn tail
(what a kill inside a `write` leaves) is cut when a replica starts, unless a
live writer holds the file.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import os
import signal
import time
from pathlib import Path

import websockets
from websockets.asyncio.client import connect

from subres.config import ConsolesSpec
from subres.demo.vnc import Display, VncServer
from subres.protocol import asciicast, displayrec
from subres.sessions.recordings import Recordings
from tests.server.test_vnc_shared import Viewer
from tests.support import LOOPBACK_POLICY, Backend, machine, serve_process

V5 = "v5.channel.k8s.io"
LINES = 200
"""Lines the client reads before the kill (a few seconds of output)."""
WAIT = 30.0


async def ticker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A console printing `line N` every 10 ms until the connection goes."""
    try:
        for number in range(1_000_000):
            writer.write(f"line {number}\r\n".encode())
            await writer.drain()
            await asyncio.sleep(0.01)  # the machine's own pace, not a synchronisation
    except ConnectionError:
        pass


async def test_a_recording_survives_sigkill_whole_and_up_to_the_last_second(
    tmp_path: Path,
) -> None:
    backend = await Backend(handler=ticker).start_tcp()
    directory = tmp_path / "recordings"
    config = {"consoles": {"recordings": {"directory": str(directory)}}}
    record = {"subres.dev/record-console": "true"}
    vm1 = machine("vm1", console=backend.url, annotations=record)
    arrived: list[tuple[float, str]] = []
    try:
        async with serve_process(tmp_path, vm1, delay=0, grace=2, config=config) as server:
            url = server.console("vm1").replace("https://", "wss://")
            async with connect(
                url,
                ssl=server.ssl(),
                additional_headers=server.auth,
                subprotocols=[websockets.Subprotocol(V5)],
            ) as ws:
                text = ""
                async with asyncio.timeout(WAIT):
                    while len(arrived) < LINES:
                        message = await ws.recv()
                        assert isinstance(message, bytes)
                        text += message[1:].decode()
                        *complete, text = text.split("\r\n")
                        now = time.monotonic()
                        arrived += [(now, line) for line in complete if line.startswith("line")]
                killed = time.monotonic()
                server.proc.send_signal(signal.SIGKILL)
                await server.proc.wait()
    finally:
        await backend.stop()
    (path,) = directory.glob("default/machines/vm1/*/*.cast")
    data = path.read_bytes()
    assert data.endswith(b"\n")
    _, events = asciicast.read(data.splitlines())
    recorded = "".join(e.data for e in events if e.code == "o")
    due = [line for when, line in arrived if when <= killed - 1.0]
    assert due, "output flowed for more than a second"
    missing = [line for line in due if f"{line}\r\n" not in recorded]
    assert missing == []


async def test_a_torn_tail_is_cut_at_start_unless_a_live_writer_holds_the_file(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "default" / "machines" / "vm1" / "none"
    folder.mkdir(parents=True)
    whole = b'{"version": 2, "width": 80, "height": 24, "timestamp": 1}\n[0.1, "o", "a"]\n'
    torn = folder / "20240101T000000Z-0000000a.cast"
    torn.write_bytes(whole + b'[0.2, "o", "b')
    held = folder / "20240101T000000Z-0000000b.cast"
    held.write_bytes(whole + b'[0.2, "o", "b')
    fd = os.open(held, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        recordings = Recordings(ConsolesSpec(recordings=str(tmp_path)))
        await recordings.start()
        await recordings.stop()
    finally:
        os.close(fd)
    assert torn.read_bytes() == whole
    assert held.read_bytes() == whole + b'[0.2, "o", "b'


async def test_a_display_recording_survives_sigkill_in_whole_blocks(tmp_path: Path) -> None:
    counter = [0]
    display = VncServer(tmp_path / "vnc.sock", display=Display(clock=lambda: f"{counter[0]:08}"))
    await display.start()
    directory = tmp_path / "recordings"
    config = {
        "endpointPolicy": {**LOOPBACK_POLICY, "socketDirs": [str(tmp_path)]},
        "consoles": {"recordings": {"directory": str(directory)}},
    }
    vm1 = machine("vm1", annotations={"subres.dev/record-display": "true"})
    vm1["status"]["vnc"] = {"endpoint": f"unix://{display.path}"}
    shown: dict[bytes, float] = {}
    try:
        async with serve_process(tmp_path, vm1, delay=0, grace=2, config=config) as server:
            url = server.console("vm1").replace("https://", "wss://")[: -len("console")] + "vnc"
            async with connect(
                url,
                ssl=server.ssl(),
                additional_headers=server.auth,
                subprotocols=[websockets.Subprotocol("binary")],
            ) as ws:
                await Viewer(ws).hello(shared=True)
                for number in range(1, 80):
                    counter[0] = number
                    display.display.tick()
                    shown[hashlib.sha256(display.display.rgb).digest()] = time.monotonic()
                    await asyncio.sleep(0.05)  # the display's own pace
                killed = time.monotonic()
                server.proc.send_signal(signal.SIGKILL)
                await server.proc.wait()
    finally:
        await display.stop()
    (path,) = directory.glob("default/machines/vm1/*/*.display")
    data = path.read_bytes()
    assert displayrec.complete_size(data) == len(data), "whole blocks only"
    screen = displayrec.Screen()
    _, offset = displayrec.read_header(data)
    for ref in displayrec.blocks(data, offset):
        for record in displayrec.records(data[ref.offset : ref.offset + ref.length]):
            screen.apply(record)
    last = shown.get(hashlib.sha256(screen.rgb).digest())
    assert last is not None, "the recording ends on a picture the display showed"
    # A second, plus the longest wait between two updates of a recording (1/displayRate).
    assert last >= killed - 1.25


async def test_a_torn_display_block_is_cut_at_start(tmp_path: Path) -> None:
    folder = tmp_path / "default" / "machines" / "vm1" / "none"
    folder.mkdir(parents=True)
    whole = displayrec.Header(1, "t").encode() + displayrec.seal(False, 0, b"\x04\x00\x00\x00\x05")
    torn = folder / "20240101T000000Z-0000000c.display"
    torn.write_bytes(whole + displayrec.seal(False, 9, b"\x04\x00\x00\x00\x09")[:-3])
    recordings = Recordings(ConsolesSpec(recordings=str(tmp_path)))
    await recordings.start()
    await recordings.stop()
    assert torn.read_bytes() == whole
