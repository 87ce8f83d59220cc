"""Client WebSocket frames for tests, and a reader that drives `FrameDecoder` as a server does.

`client_frame` builds any frame a client could send, well formed or not;
`read_frame` reads one frame a server sent; `Reader` feeds received chunks to
a decoder the way the engine does (the unconsumed bytes first, then the new
chunk) and collects whole messages and control frames with their payloads
unmasked, so tests compare bytes.
"""

from __future__ import annotations

import asyncio
import os
import struct
from dataclasses import dataclass, field

from subres.protocol.websocket import (
    MAX_LEFTOVER,
    ControlReceived,
    FrameDecoder,
    Opcode,
)

__all__ = ["Reader", "client_frame", "read_frame", "unmask"]


def unmask(data: bytes, mask: bytes) -> bytes:
    """`data` XOR the repeated 4-byte `mask` (its own inverse)."""
    return bytes(b ^ mask[i % 4] for i, b in enumerate(data))


def client_frame(
    opcode: int,
    payload: bytes,
    *,
    fin: bool = True,
    rsv: int = 0,
    mask: bytes | None = None,
    masked: bool = True,
    length: int | None = None,
) -> bytes:
    """A frame as a client sends it; `length` overrides the declared payload length."""
    key = os.urandom(4) if mask is None else mask
    head = bytes([(0x80 if fin else 0) | rsv << 4 | opcode])
    n = len(payload) if length is None else length
    bit = 0x80 if masked else 0
    if n < 126:
        head += bytes([bit | n])
    elif n < 1 << 16:
        head += bytes([bit | 126]) + struct.pack("!H", n)
    else:
        head += bytes([bit | 127]) + struct.pack("!Q", n)
    if not masked:
        return head + payload
    return head + key + unmask(payload, key)


async def read_frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One unmasked (server) frame from `reader`: its opcode and payload."""
    head = await reader.readexactly(2)
    length = head[1] & 0x7F
    if length == 126:
        length = struct.unpack("!H", await reader.readexactly(2))[0]
    elif length == 127:
        length = struct.unpack("!Q", await reader.readexactly(8))[0]
    return head[0] & 0x0F, await reader.readexactly(length)


@dataclass
class Reader:
    """Whole messages and control frames out of chunks, through one `FrameDecoder`."""

    decoder: FrameDecoder
    messages: list[tuple[Opcode, bytes]] = field(default_factory=list)
    controls: list[tuple[Opcode, bytes]] = field(default_factory=list)
    _leftover: bytes = b""
    _parts: list[bytes] = field(default_factory=list)

    def receive(self, chunk: bytes) -> None:
        """Decode `chunk`; raises the decoder's `ProtocolError`."""
        buffer = self._leftover + chunk
        events, consumed = self.decoder.feed(memoryview(buffer))
        assert 0 <= consumed <= len(buffer)
        self._leftover = buffer[consumed:]
        assert len(self._leftover) <= MAX_LEFTOVER
        for event in events:
            assert 0 <= event.start <= event.stop <= consumed
            payload = unmask(buffer[event.start : event.stop], event.mask)
            if isinstance(event, ControlReceived):
                self.controls.append((event.opcode, payload))
                continue
            assert event.first == (not self._parts)
            self._parts.append(payload)
            if event.last:
                self.messages.append((event.opcode, b"".join(self._parts)))
                self._parts = []
