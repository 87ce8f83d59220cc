"""The demo machine's display: a small RFB (VNC) server behind a unix socket.

Owns the picture (a colour gradient, the name in block letters, a clock that
ticks) and the server side of RFB 3.8/3.7/3.3 with security type None and Raw
encoding: SetPixelFormat for any true-colour format of 8, 16 or 32 bits
(32-bit formats with byte-aligned channels take a fast path), incremental
updates that wait until the clock changes, key and pointer events read and
ignored. Enough for `subres vnc demo`, `subres screenshot demo` and real
viewers; not a general VNC server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from subres.protocol.rfb import PixelFormat

__all__ = ["NATIVE_FORMAT", "Display", "VncServer", "encode_pixels"]

log = logging.getLogger(__name__)

NATIVE_FORMAT = PixelFormat(32, 24, False, True, 255, 255, 255, 16, 8, 0)
"""What ServerInit announces until a viewer asks for another format."""
MAX_CUT_TEXT = 1 << 20
TICK = 0.5
"""Seconds between looks at the clock: a second hand never lags by more."""

_FONT = {
    "S": " ### |#   #|#    | ### |    #|#   #| ### ",
    "U": "#   #|#   #|#   #|#   #|#   #|#   #| ### ",
    "B": "#### |#   #|#   #|#### |#   #|#   #|#### ",
    "R": "#### |#   #|#   #|#### |# #  |#  # |#   #",
    "E": "#####|#    |#    |#### |#    |#    |#####",
    "0": " ### |#   #|#  ##|# # #|##  #|#   #| ### ",
    "1": "  #  | ##  |  #  |  #  |  #  |  #  | ### ",
    "2": " ### |#   #|    #|   # |  #  | #   |#####",
    "3": "#####|   # |  #  |   # |    #|#   #| ### ",
    "4": "   # |  ## | # # |#  # |#####|   # |   # ",
    "5": "#####|#    |#### |    #|    #|#   #| ### ",
    "6": "  ## | #   |#    |#### |#   #|#   #| ### ",
    "7": "#####|    #|   # |  #  | #   | #   | #   ",
    "8": " ### |#   #|#   #| ### |#   #|#   #| ### ",
    "9": " ### |#   #|#   #| ####|    #|   # | ##  ",
    ":": "     |  #  |  #  |     |  #  |  #  |     ",
}
_GLYPH_W, _GLYPH_H = 5, 7


def _wall_clock() -> str:
    return time.strftime("%H:%M:%S")


class Display:
    """The demo screen as packed RGB bytes; `version` grows whenever it changes."""

    def __init__(
        self, *, width: int = 640, height: int = 400, clock: Callable[[], str] = _wall_clock
    ) -> None:
        self.width, self.height = width, height
        self.rgb = bytearray(width * height * 3)
        self.version = 0
        self._clock = clock
        self._shown = ""
        self._listeners: set[asyncio.Event] = set()
        self._paint_gradient()
        self._paint_text("SUBRES", x=40, y=60, scale=16, colour=(255, 255, 255))
        self.clock_area = (40, 260, 8 * 6 * 6 + 12, 7 * 6 + 12)
        """x, y, width, height: the only part that changes."""
        self.tick()

    def listen(self, event: asyncio.Event) -> None:
        """Set `event` whenever the picture changes."""
        self._listeners.add(event)

    def unlisten(self, event: asyncio.Event) -> None:
        """Stop setting `event`."""
        self._listeners.discard(event)

    def tick(self) -> None:
        """Redraw the clock if its text changed, and tell the listeners."""
        text = self._clock()
        if text == self._shown:
            return
        self._shown = text
        x, y, w, h = self.clock_area
        self._fill(x, y, w, h, (16, 16, 48))
        self._paint_text(text, x=x + 6, y=y + 6, scale=6, colour=(255, 208, 64))
        self.version += 1
        for event in self._listeners:
            event.set()

    def region(self, x: int, y: int, w: int, h: int) -> bytes:
        """The RGB bytes of a rectangle, row by row."""
        row = self.width * 3
        return b"".join(self.rgb[r * row + x * 3 : r * row + (x + w) * 3] for r in range(y, y + h))

    def _paint_gradient(self) -> None:
        w = self.width
        reds = bytes(x * 255 // max(w - 1, 1) for x in range(w))
        blues = bytes(255 - r for r in reds)
        for y in range(self.height):
            start = y * w * 3
            self.rgb[start : start + w * 3 : 3] = reds
            self.rgb[start + 1 : start + w * 3 : 3] = bytes([y * 255 // self.height]) * w
            self.rgb[start + 2 : start + w * 3 : 3] = blues

    def _paint_text(
        self, text: str, *, x: int, y: int, scale: int, colour: tuple[int, int, int]
    ) -> None:
        for i, char in enumerate(text):
            rows = _FONT[char].split("|")
            left = x + i * (_GLYPH_W + 1) * scale
            for gy, bits in enumerate(rows):
                for gx, bit in enumerate(bits):
                    if bit == "#":
                        self._fill(left + gx * scale, y + gy * scale, scale, scale, colour)

    def _fill(self, x: int, y: int, w: int, h: int, colour: tuple[int, int, int]) -> None:
        line = bytes(colour) * w
        for r in range(y, y + h):
            start = (r * self.width + x) * 3
            self.rgb[start : start + w * 3] = line


def encode_pixels(rgb: bytes, fmt: PixelFormat) -> bytes:
    """Packed RGB bytes as pixels of a true-colour `fmt`."""
    fast = _byte_positions(fmt)
    if fast is not None:
        out = bytearray(len(rgb) // 3 * 4)
        for channel, position in enumerate(fast):
            out[position::4] = rgb[channel::3]
        return bytes(out)
    size = fmt.bits_per_pixel // 8
    order: Literal["big", "little"] = "big" if fmt.big_endian else "little"
    cache: dict[bytes, bytes] = {}
    out = bytearray()
    for i in range(0, len(rgb), 3):
        pixel = rgb[i : i + 3]
        value = cache.get(pixel)
        if value is None:
            value = cache[pixel] = _pixel_value(pixel, fmt).to_bytes(size, order)
        out += value
    return bytes(out)


def _byte_positions(fmt: PixelFormat) -> tuple[int, int, int] | None:
    """Where R, G and B land in a 32-bit pixel, when each is a whole byte."""
    shifts = (fmt.red_shift, fmt.green_shift, fmt.blue_shift)
    maxes = (fmt.red_max, fmt.green_max, fmt.blue_max)
    if fmt.bits_per_pixel != 32 or maxes != (255, 255, 255) or len(set(shifts)) != 3:
        return None
    if any(s % 8 or s > 24 for s in shifts):
        return None
    r, g, b = (3 - s // 8 if fmt.big_endian else s // 8 for s in shifts)
    return r, g, b


def _pixel_value(pixel: bytes, fmt: PixelFormat) -> int:
    r, g, b = pixel
    return (
        (r * fmt.red_max // 255) << fmt.red_shift
        | (g * fmt.green_max // 255) << fmt.green_shift
        | (b * fmt.blue_max // 255) << fmt.blue_shift
    )


@dataclass(frozen=True)
class _Request:
    """A FramebufferUpdateRequest."""

    incremental: bool
    x: int
    y: int
    w: int
    h: int


class _Viewer:
    """One connection: the handshake, then client messages and the updates they ask for."""

    def __init__(
        self, display: Display, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.display = display
        self.reader = reader
        self.writer = writer
        self.format = NATIVE_FORMAT
        self.request: _Request | None = None
        self.seen = -1
        """The display version the viewer has; -1 before its first update."""
        self.wake = asyncio.Event()

    async def run(self) -> None:
        if not await self._handshake():
            return
        updates = asyncio.create_task(self._updates())
        self.display.listen(self.wake)
        try:
            await self._messages()
        finally:
            self.display.unlisten(self.wake)
            updates.cancel()
            await asyncio.wait([updates])

    async def _handshake(self) -> bool:
        self.writer.write(b"RFB 003.008\n")
        version = await self.reader.readexactly(12)
        if not version.startswith(b"RFB 003.") or not version[8:11].isdigit():
            log.info("demo vnc: not an RFB 3.x viewer: %r", version)
            return False
        minor = int(version[8:11])
        minor = 8 if minor >= 8 else 7 if minor == 7 else 3
        if minor == 3:
            self.writer.write(struct.pack(">I", 1))  # the server decides: None
        else:
            self.writer.write(b"\x01\x01")  # one type offered: None
            if await self.reader.readexactly(1) != b"\x01":
                return False
            if minor == 8:
                self.writer.write(struct.pack(">I", 0))  # SecurityResult OK
        await self.reader.readexactly(1)  # ClientInit: shared or not, all viewers stay
        name = b"subres demo"
        d = self.display
        init = struct.pack(">HH", d.width, d.height) + NATIVE_FORMAT.pack()
        self.writer.write(init + struct.pack(">I", len(name)) + name)
        await self.writer.drain()
        return True

    async def _messages(self) -> None:
        while True:
            kind = (await self.reader.readexactly(1))[0]
            if kind == 0:
                await self._set_pixel_format()
            elif kind == 2:
                (count,) = struct.unpack(">xH", await self.reader.readexactly(3))
                await self.reader.readexactly(4 * count)  # Raw is all we ever send
            elif kind == 3:
                self._request(await self.reader.readexactly(9))
            elif kind in (4, 5):  # KeyEvent, PointerEvent: accepted, nothing to do
                await self.reader.readexactly(7 if kind == 4 else 5)
            elif kind == 6:
                (length,) = struct.unpack(">xxxI", await self.reader.readexactly(7))
                if length > MAX_CUT_TEXT:
                    raise ConnectionError(f"ClientCutText of {length} bytes")
                await self.reader.readexactly(length)
            else:
                raise ConnectionError(f"unknown client message type {kind}")

    async def _set_pixel_format(self) -> None:
        fmt = PixelFormat.unpack((await self.reader.readexactly(19))[3:])
        if not fmt.true_colour or fmt.bits_per_pixel not in (8, 16, 32):
            raise ConnectionError(f"unsupported pixel format {fmt}")
        self.format = fmt

    def _request(self, data: bytes) -> None:
        incremental, x, y, w, h = struct.unpack(">BHHHH", data)
        self.request = _Request(bool(incremental), x, y, w, h)
        self.wake.set()

    async def _updates(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            area = self._due()
            if area is None:
                continue
            self.request = None
            self.seen = self.display.version
            x, y, w, h = area
            pixels = encode_pixels(self.display.region(x, y, w, h), self.format)
            header = struct.pack(">BxHHHHHi", 0, 1, x, y, w, h, 0)
            self.writer.write(header + pixels)
            await self.writer.drain()

    def _due(self) -> tuple[int, int, int, int] | None:
        """The area to send for the pending request now; None to keep waiting."""
        request = self.request
        if request is None:
            return None
        d = self.display
        area = _clip((request.x, request.y, request.w, request.h), (0, 0, d.width, d.height))
        if not request.incremental or self.seen < 0:
            return area
        if self.seen == d.version:
            return None
        changed = _clip(area, d.clock_area)
        if changed[2] == 0 or changed[3] == 0:
            self.seen = d.version  # the change lies outside what the viewer asked for
            return None
        return changed


def _clip(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    left, top = max(a[0], b[0]), max(a[1], b[1])
    right, bottom = min(a[0] + a[2], b[0] + b[2]), min(a[1] + a[3], b[1] + b[3])
    return left, top, max(right - left, 0), max(bottom - top, 0)


class VncServer:
    """A unix-socket RFB server showing `display` to any number of viewers."""

    def __init__(self, path: Path, *, display: Display | None = None) -> None:
        self.path = path
        self.display = display or Display()
        self._server: asyncio.Server | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._viewers: dict[asyncio.Task[None], asyncio.StreamWriter] = {}

    async def start(self) -> None:
        """Listen on the socket path (replacing a stale socket) and start the clock."""
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self._server = await asyncio.start_unix_server(self._serve, path=str(self.path))
        os.chmod(self.path, 0o600)
        self._ticker = asyncio.create_task(self._tick())

    async def stop(self) -> None:
        """Stop listening, the clock and every viewer."""
        if self._server is not None:
            self._server.close()
        if self._ticker is not None:
            self._ticker.cancel()
        # Hanging up ends each viewer's read; cancelling its task instead would
        # make asyncio's stream callback log the cancellation as an error.
        for writer in self._viewers.values():
            writer.transport.abort()
        tasks = [*self._viewers, *([self._ticker] if self._ticker else [])]
        if tasks:
            await asyncio.wait(tasks)
        if self._server is not None:
            await self._server.wait_closed()

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(TICK)
            self.display.tick()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._viewers[task] = writer
        try:
            await _Viewer(self.display, reader, writer).run()
        except (OSError, asyncio.IncompleteReadError) as exc:
            log.debug("demo vnc viewer left: %s", exc)
        finally:
            del self._viewers[task]
            writer.close()
