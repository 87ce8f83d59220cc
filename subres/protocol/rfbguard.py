"""What a VNC viewer may send: every viewer shares the display, a view-only one never types.

subres, not the VNC server, decides who may use a display, so every viewer's
ClientInit is rewritten to ask for a shared session (RFC 6143 7.3.1): a
viewer asking for exclusive access would otherwise disconnect the others.
After that an interactive viewer's bytes pass untouched. A view-only
viewer's messages are read one by one (RFC 6143 7.5 and the registered
extensions noVNC, TigerVNC and QEMU send) and every one that acts on the
machine is dropped: key and pointer events, cut text, desktop resizes, xvp
(power) and gii input, QEMU's extended key events. A message that cannot be
framed (an unknown type, a security type whose bytes are hidden from us)
ends a view-only viewer's session: it cannot be checked, so it is refused.

In RFB 3.3 the server chooses the security type; the guard reads the
server's first 16 bytes for it (`from_server`), and nothing more.

Memory stays bounded whatever the viewer or the guest does: a message's body
passes (or is dropped) as its bytes arrive, so what the guard holds between
calls is at most an unfinished header (`HEAD_LIMIT`), except while an RFB
3.3 viewer waits for the server's security type: a viewer that sends more
than `MAX_EARLY` bytes then (a legitimate one sends none) is refused, be it
view-only or interactive, since its ClientInit must still be rewritten.

Bytes in give the bytes to forward out. No I/O.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable

from subres.protocol.rfb import SECURITY_NONE

__all__ = ["ViewerGuard", "ViewerRefused"]

VERSION_SIZE = 12
SECURITY_VNC = 2
VNC_RESPONSE = 16
MAX_CUT_TEXT = 1 << 20
"""Longest cut text (dropped anyway) whose bytes a view-only viewer may send."""
MAX_EARLY = 64 << 10
"""Bytes an RFB 3.3 viewer may send before the server's security type reached the guard."""
HEAD_LIMIT = VNC_RESPONSE
"""The most the guard holds between calls once it is not waiting for the server."""

# Client-to-server message types: RFC 6143 7.5 and the IANA registry.
SET_PIXEL_FORMAT = 0
SET_ENCODINGS = 2
UPDATE_REQUEST = 3
KEY_EVENT = 4
POINTER_EVENT = 5
CUT_TEXT = 6
CONTINUOUS_UPDATES = 150
XVP = 250
SET_DESKTOP_SIZE = 251
GII = 253
CLIENT_FENCE = 248
QEMU = 255
QEMU_KEY = 0
QEMU_AUDIO = 1

FIXED = {
    SET_PIXEL_FORMAT: (20, True),
    UPDATE_REQUEST: (10, True),
    KEY_EVENT: (8, False),
    POINTER_EVENT: (6, False),
    CONTINUOUS_UPDATES: (10, True),
    XVP: (4, False),
}
"""Messages of a fixed size: (size, passed to the server)."""


class ViewerRefused(ValueError):
    """A view-only viewer sent what cannot be checked; the message says what."""

    # (An error and a stage enum, as rfb.py's client has: only the shape is shared.)


class _Stage(enum.Enum):
    VERSION = "version"
    SECURITY = "security"
    AUTH = "authentication"
    INIT = "ClientInit"
    MESSAGES = "messages"
    TRANSPARENT = "transparent"


class ViewerGuard:
    """Filters one viewer's bytes on their way to the VNC server."""

    def __init__(self, *, view_only: bool) -> None:
        self.view_only = view_only
        self._stage = _Stage.VERSION
        self._pending = bytearray()
        self._server = bytearray()
        self._minor = 0
        self._security: int | None = None
        self._body = 0
        """Bytes of the current message still to pass or drop as they arrive."""
        self._body_passed = False
        self.dropped = 0
        """Messages dropped so far (a view-only viewer's input)."""

    @property
    def buffered(self) -> int:
        """Viewer bytes held back until more arrive."""
        return len(self._pending)

    @property
    def transparent(self) -> bool:
        """Everything from now on passes as it is."""
        return self._stage is _Stage.TRANSPARENT

    @property
    def wants_server(self) -> bool:
        """The guard still needs the server's bytes (an RFB 3.3 security type)."""
        return self._security is None and len(self._server) < VERSION_SIZE + 4

    def from_server(self, data: bytes) -> None:
        """Bytes the server sent the viewer (only the first 16 matter)."""
        if self.wants_server:
            self._server += data[: VERSION_SIZE + 4 - len(self._server)]

    def from_client(self, data: bytes) -> bytes:
        """What of the viewer's `data` goes on to the server (raises `ViewerRefused`)."""
        if self.transparent:
            return data
        self._pending += data
        out = bytearray()
        while (step := self._step()) is not None:
            out += step
            if self.transparent:
                out += self._pending
                self._pending.clear()
                break
        return bytes(out)

    def _step(self) -> bytes | None:
        """Consume one unit of the viewer's stream: the bytes to pass, or None for more input."""
        handler = {
            _Stage.VERSION: self._version,
            _Stage.SECURITY: self._chosen,
            _Stage.AUTH: self._auth,
            _Stage.INIT: self._init,
            _Stage.MESSAGES: self._message,
        }[self._stage]
        return handler()

    def _take(self, size: int) -> bytes | None:
        if len(self._pending) < size:
            return None
        taken = bytes(self._pending[:size])
        del self._pending[:size]
        return taken

    def _give_up(self, why: str) -> bytes:
        """Pass everything from now on, or refuse a view-only viewer."""
        if self.view_only:
            raise ViewerRefused(why)
        self._stage = _Stage.TRANSPARENT
        return b""

    def _version(self) -> bytes | None:
        if len(self._pending) < VERSION_SIZE:
            start = bytes(self._pending[:4])
            if b"RFB ".startswith(start):
                return None
            return self._give_up(f"not an RFB protocol version: {start!r}")
        version = bytes(self._pending[:VERSION_SIZE])
        minor = version[8:11]
        well_formed = version[:4] == b"RFB " and version[7:8] == b"." and version[11:] == b"\n"
        if not (well_formed and minor.isdigit()):
            # Left in place: an interactive viewer's bytes pass as they came.
            return self._give_up(f"not an RFB protocol version: {version!r}")
        del self._pending[:VERSION_SIZE]
        self._minor = int(minor)
        self._stage = _Stage.SECURITY
        return version

    def _chosen(self) -> bytes | None:
        if self._minor >= 7:
            choice = self._take(1)
            if choice is None:
                return None
            self._security = choice[0]
            self._stage = _Stage.AUTH
            return choice
        # RFB 3.3: the server chose, and its bytes reached the viewer (through
        # `from_server`) before the viewer could answer them.
        if len(self._server) < VERSION_SIZE + 4:
            if len(self._pending) > MAX_EARLY:
                # Held, not forwarded: a hung guest must not make us keep it all.
                raise ViewerRefused(
                    f"the viewer sent {len(self._pending)} bytes before the VNC server "
                    "chose a security type"
                )
            return None
        (self._security,) = struct.unpack(">I", self._server[VERSION_SIZE:])
        self._stage = _Stage.AUTH
        return b""

    def _auth(self) -> bytes | None:
        if self._security == SECURITY_NONE:
            self._stage = _Stage.INIT
            return b""
        if self._security == SECURITY_VNC:
            response = self._take(VNC_RESPONSE)
            if response is not None:
                self._stage = _Stage.INIT
            return response
        return self._give_up(
            f"view-only viewers need VNC security None or VNC Authentication, "
            f"not security type {self._security}"
        )

    def _init(self) -> bytes | None:
        if self._take(1) is None:
            return None
        # Shared: the server must not disconnect the other viewers for this one.
        self._stage = _Stage.MESSAGES if self.view_only else _Stage.TRANSPARENT
        return b"\x01"

    def _message(self) -> bytes | None:
        if not self._pending:
            return None
        if not self._body:
            size, passed = self._size(self._pending[0])
            if size is None:
                return None
            self._body, self._body_passed = size, passed
            if not passed:
                self.dropped += 1
        # The body goes on (or is dropped) as it arrives, never held whole.
        part = bytes(self._pending[: self._body])
        del self._pending[: len(part)]
        self._body -= len(part)
        return part if self._body_passed else b""

    def _size(self, kind: int) -> tuple[int | None, bool]:
        """The size of the message starting the pending bytes (None: not known yet)."""
        if kind in FIXED:
            return FIXED[kind]
        head = bytes(self._pending[:9])
        if kind == QEMU:
            return _qemu(head)
        if kind not in VARIABLE:
            raise ViewerRefused(f"unknown RFB message type {kind} from a view-only viewer")
        size, passed = VARIABLE[kind]
        return size(head), passed


def _encodings(head: bytes) -> int | None:
    return 4 + 4 * int(struct.unpack(">H", head[2:4])[0]) if len(head) >= 4 else None


def _cut_text(head: bytes) -> int | None:
    if len(head) < 8:
        return None
    length = int(struct.unpack(">i", head[4:8])[0])
    # A negative length is the extended clipboard's (its size is the absolute value).
    if abs(length) > MAX_CUT_TEXT:
        raise ViewerRefused(f"cut text of {abs(length)} bytes from a view-only viewer")
    return 8 + abs(length)


def _fence(head: bytes) -> int | None:
    return 9 + head[8] if len(head) >= 9 else None


def _desktop_size(head: bytes) -> int | None:
    return 8 + 16 * head[6] if len(head) >= 7 else None


def _gii(head: bytes) -> int | None:
    if len(head) < 4:
        return None
    order = ">" if head[1] & 0x80 else "<"
    return 4 + int(struct.unpack(order + "H", head[2:4])[0])


def _qemu(head: bytes) -> tuple[int | None, bool]:
    if len(head) < 2:
        return None, False
    if head[1] == QEMU_KEY:
        return 12, False
    if head[1] != QEMU_AUDIO:
        raise ViewerRefused(f"unknown QEMU RFB message {head[1]} from a view-only viewer")
    if len(head) < 4:
        return None, True
    # Enable and disable are 4 bytes; set-format (2) carries 6 more.
    return (10 if struct.unpack(">H", head[2:4])[0] == 2 else 4), True


VARIABLE: dict[int, tuple[Callable[[bytes], int | None], bool]] = {
    SET_ENCODINGS: (_encodings, True),
    CUT_TEXT: (_cut_text, False),
    CLIENT_FENCE: (_fence, True),
    SET_DESKTOP_SIZE: (_desktop_size, False),
    GII: (_gii, False),
}
"""Messages whose size their first bytes give: (size from the first 9 bytes, passed on)."""
