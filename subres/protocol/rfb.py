"""RFB (VNC) client codec that captures one framebuffer, as RFC 6143 describes.

Owns the byte layout the `screenshot` subresource needs: the version and
security handshake (RFB 3.3, 3.7 and 3.8, security type None), ClientInit
with the shared flag (a screenshot must not disconnect a live viewer),
ServerInit, SetPixelFormat to 32-bit true colour, SetEncodings Raw, one
non-incremental FramebufferUpdateRequest for the whole screen, and the
rectangles of the answer, each row stored as 8-bit RGB as it arrives (the
framebuffer is the only copy of the picture: 3 bytes a pixel, no second
buffer to convert). Pseudo-encodings a server sends unasked are skipped
(a desktop resize asks again for the new size). Everything a hostile server
controls is bounded (`Limits`) and breaking a rule raises `RfbError`.

Bytes in (`receive_data`) give events out; bytes to send accumulate for
`data_to_send`. No I/O, no clock.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

__all__ = [
    "CAPTURE_FORMAT",
    "Event",
    "FramebufferCaptured",
    "Limits",
    "Phase",
    "PixelFormat",
    "RfbError",
    "ScreenshotClient",
    "ServerInitialised",
]

SECURITY_NONE = 1
SECURITY_NAMES = {0: "Invalid", 1: "None", 2: "VNC Authentication", 18: "TLS", 19: "VeNCrypt"}

# Encodings (RFC 6143 7.7 and the registry of pseudo-encodings).
RAW = 0
DESKTOP_SIZE = -223
LAST_RECT = -224
POINTER_POS = -232
CURSOR = -239
X_CURSOR = -240
EXTENDED_DESKTOP_SIZE = -308

# Server-to-client message types (RFC 6143 7.6).
FRAMEBUFFER_UPDATE = 0
SET_COLOUR_MAP_ENTRIES = 1
BELL = 2
SERVER_CUT_TEXT = 3

_VERSION_SIZE = 12
_RECT = struct.Struct(">HHHHi")


class RfbError(ValueError):
    """The VNC server broke the protocol, refused us, or exceeded a limit."""


class Phase(enum.Enum):
    """Where the capture is; the value says it in words for error messages."""

    VERSION = "waiting for the RFB protocol version"
    SECURITY = "waiting for the security types"
    SECURITY_RESULT = "waiting for the security result"
    SERVER_INIT = "waiting for ServerInit"
    UPDATE = "waiting for the framebuffer update"
    DONE = "done"


@dataclass(frozen=True)
class Limits:
    """Bounds on what a server may make us hold or do."""

    max_pixels: int = 4096 * 4096
    """Largest framebuffer (width * height) accepted: 48 MiB held at 3 bytes a pixel."""
    max_text: int = 1 << 20
    """Longest desktop name, failure reason or cut text accepted."""
    max_messages: int = 1024
    """Server messages accepted after ServerInit before the capture completes."""
    max_requests: int = 4
    """FramebufferUpdateRequests sent in all (desktop resizes ask again)."""


@dataclass(frozen=True)
class PixelFormat:
    """PIXEL_FORMAT (RFC 6143 7.4)."""

    bits_per_pixel: int
    depth: int
    big_endian: bool
    true_colour: bool
    red_max: int
    green_max: int
    blue_max: int
    red_shift: int
    green_shift: int
    blue_shift: int

    _STRUCT = struct.Struct(">BBBBHHHBBBxxx")

    def pack(self) -> bytes:
        """The 16 bytes on the wire."""
        return self._STRUCT.pack(
            self.bits_per_pixel,
            self.depth,
            self.big_endian,
            self.true_colour,
            self.red_max,
            self.green_max,
            self.blue_max,
            self.red_shift,
            self.green_shift,
            self.blue_shift,
        )

    @classmethod
    def unpack(cls, data: bytes) -> PixelFormat:
        """The format in 16 wire bytes."""
        bpp, depth, big, true, rmax, gmax, bmax, rs, gs, bs = cls._STRUCT.unpack(data)
        return cls(bpp, depth, bool(big), bool(true), rmax, gmax, bmax, rs, gs, bs)


CAPTURE_FORMAT = PixelFormat(32, 24, False, True, 255, 255, 255, 16, 8, 0)
"""What we ask for: little-endian 0x00RRGGBB, i.e. bytes B, G, R, padding."""
_BYTES_PER_PIXEL = 4
_RGB = 3


@dataclass(frozen=True)
class ServerInitialised:
    """ServerInit arrived: the framebuffer's size and the desktop's name."""

    width: int
    height: int
    name: str


@dataclass(frozen=True)
class FramebufferCaptured:
    """The whole framebuffer as packed 8-bit R, G, B, row by row.

    `rgb` is the client's own buffer, handed over (not copied): the client is
    done with it.
    """

    width: int
    height: int
    rgb: bytearray

    def row(self, y: int) -> memoryview:
        """Row `y`'s RGB bytes, without a copy."""
        size = self.width * _RGB
        return memoryview(self.rgb)[y * size : (y + 1) * size]


Event = ServerInitialised | FramebufferCaptured


@dataclass
class _Rect:
    """The Raw rectangle whose pixel rows are arriving."""

    x: int
    y: int
    width: int
    rows_left: int
    next_row: int


class ScreenshotClient:
    """The client side of one RFB connection that reads one framebuffer."""

    ENCODINGS: tuple[int, ...] = (RAW,)
    """What SetEncodings asks for (Raw only: the capture decodes nothing else)."""

    def __init__(self, *, limits: Limits = Limits()) -> None:
        self.limits = limits
        self.phase = Phase.VERSION
        self.minor = 0
        """The protocol version agreed: 3, 7 or 8 (of RFB 3.x)."""
        self._in = bytearray()
        self._pos = 0
        self._out = bytearray()
        self._width = 0
        self._height = 0
        self._framebuffer = bytearray()
        self._messages = 0
        self._requests = 0
        self._rects_left = 0
        self._rect: _Rect | None = None
        self._raw_pixels = 0
        self._resized = False
        self._events: list[Event] = []

    def data_to_send(self) -> bytes:
        """Bytes queued for the server."""
        out = bytes(self._out)
        self._out.clear()
        return out

    def receive_data(self, data: bytes) -> list[Event]:
        """Feed bytes from the server; the events they complete."""
        if self.phase is Phase.DONE:
            return []
        del self._in[: self._pos]
        self._pos = 0
        self._in += data
        while self._step():
            pass
        events, self._events = self._events, []
        return events

    # Reading helpers: `_peek` looks without consuming, `_take` consumes.

    def _available(self) -> int:
        return len(self._in) - self._pos

    def _peek(self, size: int, offset: int = 0) -> bytes | None:
        start = self._pos + offset
        if len(self._in) - start < size:
            return None
        return bytes(self._in[start : start + size])

    def _take(self, size: int) -> bytes:
        data = bytes(self._in[self._pos : self._pos + size])
        self._pos += size
        return data

    def _step(self) -> bool:
        """Parse one unit; False when more bytes are needed or the capture is done."""
        steps = {
            Phase.VERSION: self._version,
            Phase.SECURITY: self._security,
            Phase.SECURITY_RESULT: self._security_result,
            Phase.SERVER_INIT: self._server_init,
            Phase.UPDATE: self._update,
        }
        step = steps.get(self.phase)
        return step is not None and step()

    def _version(self) -> bool:
        data = self._peek(_VERSION_SIZE)
        if data is None:
            return False
        self._take(_VERSION_SIZE)
        major, minor = _parse_version(data)
        if (major, minor) < (3, 3):
            raise RfbError(f"the server speaks RFB {major}.{minor}, older than 3.3")
        # RFC 6143 7.1.1: answer with the highest version both sides know; 3.5
        # (misreported by some) and any other 3.x below 3.7 mean 3.3.
        self.minor = 8 if (major, minor) >= (3, 8) else 7 if (major, minor) >= (3, 7) else 3
        self._out += b"RFB 003.00%d\n" % self.minor
        self.phase = Phase.SECURITY
        return True

    def _security(self) -> bool:
        return self._security_33() if self.minor == 3 else self._security_list()

    def _security_33(self) -> bool:
        head = self._peek(4)
        if head is None:
            return False
        (kind,) = struct.unpack(">I", head)
        if kind == 0:
            return self._failure("the server refused the connection")
        self._take(4)
        if kind != SECURITY_NONE:
            raise RfbError(_needs_none([kind]))
        self._authenticated()
        return True

    def _security_list(self) -> bool:
        head = self._peek(1)
        if head is None:
            return False
        if head[0] == 0:
            return self._failure("the server refused the connection", offset=1)
        types = self._peek(head[0], offset=1)
        if types is None:
            return False
        self._take(1 + head[0])
        if SECURITY_NONE not in types:
            raise RfbError(_needs_none(list(types)))
        self._out.append(SECURITY_NONE)
        if self.minor == 8:
            self.phase = Phase.SECURITY_RESULT
        else:
            self._authenticated()  # 3.7 sends no SecurityResult for None.
        return True

    def _security_result(self) -> bool:
        head = self._peek(4)
        if head is None:
            return False
        (result,) = struct.unpack(">I", head)
        if result != 0:
            return self._failure(f"security handshake failed (result {result})", offset=4)
        self._take(4)
        self._authenticated()
        return True

    def _failure(self, what: str, *, offset: int = 4) -> bool:
        """Raise with the reason string at `offset`; False while it is incomplete."""
        head = self._peek(4, offset)
        if head is None:
            return False
        (length,) = struct.unpack(">I", head)
        if length > self.limits.max_text:
            raise RfbError(f"{what}; its reason is {length} bytes long")
        reason = self._peek(length, offset + 4)
        if reason is None:
            return False
        raise RfbError(f"{what}: {reason.decode('utf-8', 'replace')}")

    def _authenticated(self) -> None:
        self._out.append(1)  # ClientInit, shared: leave other viewers connected.
        self.phase = Phase.SERVER_INIT

    def _server_init(self) -> bool:
        head = self._peek(24)
        if head is None:
            return False
        width, height = struct.unpack(">HH", head[:4])
        (length,) = struct.unpack(">I", head[20:24])
        if length > self.limits.max_text:
            raise RfbError(f"the desktop name is {length} bytes long")
        name = self._peek(length, 24)
        if name is None:
            return False
        self._take(24 + length)
        self._resize(width, height)
        self._events.append(ServerInitialised(width, height, name.decode("utf-8", "replace")))
        self._out += struct.pack(">Bxxx", 0) + CAPTURE_FORMAT.pack()  # SetPixelFormat
        encodings = self.ENCODINGS
        self._out += struct.pack(f">BxH{len(encodings)}i", 2, len(encodings), *encodings)
        self._request()
        self.phase = Phase.UPDATE
        return True

    def _resize(self, width: int, height: int) -> None:
        if width == 0 or height == 0:
            raise RfbError(f"the framebuffer is empty ({width}x{height})")
        if width * height > self.limits.max_pixels:
            raise RfbError(
                f"the framebuffer is {width}x{height}, over {self.limits.max_pixels} pixels"
            )
        self._width, self._height = width, height
        self._framebuffer = bytearray(width * height * _RGB)

    def _request(self) -> None:
        if self._requests >= self.limits.max_requests:
            raise RfbError(f"no complete framebuffer after {self._requests} requests")
        self._requests += 1
        self._out += struct.pack(">BBHHHH", 3, 0, 0, 0, self._width, self._height)

    def _update(self) -> bool:
        if self._rect is not None:
            return self._rect_rows(self._rect)
        if self._rects_left:
            return self._rect_header()
        return self._message()

    def _message(self) -> bool:
        head = self._peek(1)
        if head is None:
            return False
        handlers = {
            FRAMEBUFFER_UPDATE: self._update_header,
            SET_COLOUR_MAP_ENTRIES: self._colour_map,
            BELL: self._bell,
            SERVER_CUT_TEXT: self._cut_text,
        }
        handler = handlers.get(head[0])
        if handler is None:
            raise RfbError(f"unknown server message type {head[0]}")
        if not handler():
            return False
        self._messages += 1
        if self._messages > self.limits.max_messages and self.phase is not Phase.DONE:
            raise RfbError(f"no framebuffer after {self.limits.max_messages} server messages")
        return True

    def _update_header(self) -> bool:
        head = self._peek(4)
        if head is None:
            return False
        self._take(4)
        (self._rects_left,) = struct.unpack(">H", head[2:])
        self._raw_pixels = 0
        self._resized = False
        if self._rects_left == 0:
            self._update_done()
        return True

    def _colour_map(self) -> bool:
        # Ignored: we asked for true colour. Bounded by its u16 count.
        head = self._peek(6)
        if head is None:
            return False
        (count,) = struct.unpack(">H", head[4:])
        if self._available() < 6 + 6 * count:
            return False
        self._take(6 + 6 * count)
        return True

    def _bell(self) -> bool:
        self._take(1)
        return True

    def _cut_text(self) -> bool:
        head = self._peek(8)
        if head is None:
            return False
        (length,) = struct.unpack(">I", head[4:])
        if length > self.limits.max_text:
            raise RfbError(f"ServerCutText of {length} bytes")
        if self._available() < 8 + length:
            return False
        self._take(8 + length)
        return True

    def _rect_header(self) -> bool:
        head = self._peek(_RECT.size)
        if head is None:
            return False
        x, y, width, height, encoding = _RECT.unpack(head)
        if encoding == RAW:
            self._take(_RECT.size)
            self._raw_rect(x, y, width, height)
            return True
        skip = self._pseudo_size(encoding, width, height)
        if skip is None or self._available() < _RECT.size + skip:
            return False
        self._take(_RECT.size + skip)
        self._pseudo(encoding, width, height)
        return True

    def _raw_rect(self, x: int, y: int, width: int, height: int) -> None:
        if x + width > self._width or y + height > self._height:
            raise RfbError(
                f"rectangle {width}x{height}+{x}+{y} outside the "
                f"{self._width}x{self._height} framebuffer"
            )
        # Overlapping rectangles are legal; twice the screen is more than any server needs.
        self._raw_pixels += width * height
        if self._raw_pixels > 2 * self._width * self._height:
            raise RfbError("the update carries more than twice the framebuffer's pixels")
        if width and height:
            self._rect = _Rect(x, y, width, height, y)
        else:
            self._rect_done()

    def _rect_rows(self, rect: _Rect) -> bool:
        row = rect.width * _BYTES_PER_PIXEL
        rows = min(rect.rows_left, self._available() // row)
        if rows == 0:
            return False
        stride = self._width * _RGB
        fb, data = self._framebuffer, self._in
        for _ in range(rows):
            start = rect.next_row * stride + rect.x * _RGB
            end, pos = start + rect.width * _RGB, self._pos
            # Wire bytes B, G, R, padding (CAPTURE_FORMAT) to R, G, B in place.
            fb[start:end:3] = data[pos + 2 : pos + row : 4]
            fb[start + 1 : end : 3] = data[pos + 1 : pos + row : 4]
            fb[start + 2 : end : 3] = data[pos : pos + row : 4]
            self._pos += row
            rect.next_row += 1
        rect.rows_left -= rows
        if rect.rows_left == 0:
            self._rect = None
            self._rect_complete(rect)
            self._rect_done()
        return True

    def _rect_complete(self, rect: _Rect) -> None:
        """A Raw rectangle is in the framebuffer (a watching client notes where)."""

    def _pseudo_size(self, encoding: int, width: int, height: int) -> int | None:
        """Bytes after the header of a pseudo-rectangle; None until they can be known."""
        if encoding in (DESKTOP_SIZE, LAST_RECT, POINTER_POS):
            return 0
        if encoding == CURSOR:
            return width * height * _BYTES_PER_PIXEL + (width + 7) // 8 * height
        if encoding == X_CURSOR:
            return 6 + 2 * ((width + 7) // 8) * height if width and height else 0
        if encoding == EXTENDED_DESKTOP_SIZE:
            count = self._peek(1, _RECT.size)
            return None if count is None else 4 + 16 * count[0]
        raise RfbError(f"rectangle in encoding {encoding}, which we did not ask for")

    def _pseudo(self, encoding: int, width: int, height: int) -> None:
        if encoding in (DESKTOP_SIZE, EXTENDED_DESKTOP_SIZE):
            self._resize(width, height)
            self._resized = True
        if encoding == LAST_RECT:
            self._rects_left = 1
        self._rect_done()

    def _rect_done(self) -> None:
        self._rects_left -= 1
        if self._rects_left == 0:
            self._update_done()

    def _update_done(self) -> None:
        # A non-incremental request is answered with the whole area; after a
        # resize (or an update with no pixels) the old answer no longer counts.
        if self._resized or self._raw_pixels == 0:
            self._request()
            return
        self.phase = Phase.DONE
        captured = FramebufferCaptured(self._width, self._height, self._framebuffer)
        self._framebuffer = bytearray()
        self._events.append(captured)


def _parse_version(data: bytes) -> tuple[int, int]:
    if not (data.startswith(b"RFB ") and data[7:8] == b"." and data.endswith(b"\n")):
        raise RfbError(f"not an RFB server: it sent {data!r}")
    major, minor = data[4:7], data[8:11]
    if not (major.isdigit() and minor.isdigit()):
        raise RfbError(f"not an RFB server: it sent {data!r}")
    return int(major), int(minor)


def _needs_none(types: list[int]) -> str:
    offered = ", ".join(f"{SECURITY_NAMES.get(t, 'type')} ({t})" for t in types)
    return (
        f"the VNC server requires authentication (offers {offered}); "
        "screenshots need security type None"
    )
