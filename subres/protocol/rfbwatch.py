"""RFB client codec that follows a display as it changes, for its recording.

The screenshot client's handshake (shared ClientInit, 32-bit true colour,
Raw), then: a whole framebuffer, then incremental updates, each asked for
by the driver (`request`) at the pace it chooses, so the recording's cost
is the driver's to bound. Desktop resizes are asked for
(DesktopSize, ExtendedDesktopSize) and answered with a whole framebuffer
again. Nothing is ever sent that acts on the machine, and the server's cut
text is read past, never kept.

Events: `ServerInitialised`, `FrameReady` (the framebuffer holds a whole
frame: the first, or after a resize) and `Changed` (the rectangles an
incremental update changed). `pixels` reads a rectangle back as RGB. No
I/O, no clock.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from subres.protocol.rfb import (
    DESKTOP_SIZE,
    EXTENDED_DESKTOP_SIZE,
    RAW,
    Limits,
    ScreenshotClient,
    ServerInitialised,
    _Rect,
)

__all__ = ["Changed", "Event", "FrameReady", "ServerInitialised", "WatchClient"]

_RGB = 3


@dataclass(frozen=True)
class FrameReady:
    """The framebuffer holds a whole frame of this size."""

    width: int
    height: int


@dataclass(frozen=True)
class Changed:
    """An incremental update finished; these rectangles (x, y, width, height) changed."""

    rects: tuple[tuple[int, int, int, int], ...]


Event = ServerInitialised | FrameReady | Changed


class WatchClient(ScreenshotClient):
    """The client side of one RFB connection that watches a display change."""

    ENCODINGS = (RAW, DESKTOP_SIZE, EXTENDED_DESKTOP_SIZE)

    def __init__(self, *, limits: Limits | None = None) -> None:
        super().__init__(limits=limits or Limits())
        self._whole = False
        self._changed: list[tuple[int, int, int, int]] = []
        self._watched: list[Event] = []

    def receive_data(self, data: bytes) -> list[Event]:  # type: ignore[override]
        """Feed bytes from the server; the events they complete."""
        # The screenshot client's own events are only ever ServerInitialised, which comes first.
        events: list[Event] = [
            e for e in super().receive_data(data) if isinstance(e, ServerInitialised)
        ]
        events += self._watched
        self._watched = []
        return events

    @property
    def size(self) -> tuple[int, int]:
        """The framebuffer's width and height."""
        return self._width, self._height

    @property
    def framebuffer(self) -> memoryview:
        """The whole framebuffer as RGB rows (valid until the next `receive_data`)."""
        return memoryview(self._framebuffer)

    def request(self) -> None:
        """Ask for the next incremental update (sent with `data_to_send`)."""
        self._out += struct.pack(">BBHHHH", 3, 1, 0, 0, self._width, self._height)

    def pixels(self, x: int, y: int, width: int, height: int) -> bytes:
        """A rectangle of the framebuffer as RGB rows."""
        stride, row = self._width * _RGB, width * _RGB
        fb = self._framebuffer
        if width == self._width:
            return bytes(fb[y * stride : (y + height) * stride])
        return b"".join(
            fb[line * stride + x * _RGB : line * stride + x * _RGB + row]
            for line in range(y, y + height)
        )

    def _request(self) -> None:
        """A whole framebuffer (the first, or after a resize): asked for without a bound."""
        self._whole = True
        self._out += struct.pack(">BBHHHH", 3, 0, 0, 0, self._width, self._height)

    def _pseudo(self, encoding: int, width: int, height: int) -> None:
        # QEMU repeats ExtendedDesktopSize with every whole update: only a new size is a resize.
        if encoding in (DESKTOP_SIZE, EXTENDED_DESKTOP_SIZE) and (width, height) == self.size:
            self._rect_done()
            return
        super()._pseudo(encoding, width, height)

    def _rect_complete(self, rect: _Rect) -> None:
        self._changed.append((rect.x, rect.y, rect.width, rect.next_row - rect.y))

    def _update_done(self) -> None:
        # Messages are bounded per update, not per connection: a watch has no end.
        self._messages = 0
        changed, self._changed = tuple(self._changed), []
        if self._resized:
            self._request()
        elif self._whole:
            self._whole = False
            self._watched.append(FrameReady(self._width, self._height))
        else:
            self._watched.append(Changed(changed))
