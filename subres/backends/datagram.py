"""UDP backends: a connected datagram socket in the shape of a `ByteStream`.

One `read` is one datagram and one `write` sends one, so a pump that moves
chunk by chunk keeps datagram boundaries. UDP has no end, so the stream ends
when nothing moved either way for `idle_timeout` seconds, when the peer
answers with an ICMP error (ECONNREFUSED on a connected socket), or shortly
after `write_eof`. Empty datagrams are not forwarded: an empty chunk means EOF
to the pump.
"""

from __future__ import annotations

import asyncio
import logging

from subres.backends.endpoint import Target
from subres.backends.stream import BackendUnavailable

__all__ = ["EOF_GRACE", "IDLE_TIMEOUT", "QUEUE_SIZE", "DatagramStream", "dial"]

log = logging.getLogger(__name__)

IDLE_TIMEOUT = 120.0
"""Seconds without a datagram either way before the stream ends (conntrack's UDP stream time)."""
EOF_GRACE = 1.0
"""After `write_eof`, seconds to wait for late replies before ending."""
QUEUE_SIZE = 256
"""Datagrams held for a slow reader; more are dropped, as a full socket buffer would."""


class _Protocol(asyncio.DatagramProtocol):
    """Queues what arrives; remembers whether the kernel buffer wants us to wait."""

    def __init__(self, queue: asyncio.Queue[bytes | None]) -> None:
        self.queue = queue
        self.dropped = 0
        self.writable = asyncio.Event()
        self.writable.set()

    def datagram_received(self, data: bytes, addr: object) -> None:
        if not data:
            return  # b"" in the queue is `write_eof`'s wake-up, and an empty chunk is EOF
        try:
            self.queue.put_nowait(data)
        except asyncio.QueueFull:
            self.dropped += 1

    def error_received(self, exc: Exception) -> None:
        log.info("udp backend error: %s", exc)
        self._end()

    def connection_lost(self, exc: Exception | None) -> None:
        self.writable.set()
        self._end()

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def _end(self) -> None:
        # The end marker must get in even when the queue is full of data nobody reads.
        if self.queue.full():
            self.queue.get_nowait()
            self.dropped += 1
        self.queue.put_nowait(None)


class DatagramStream:
    """A connected UDP socket read and written one datagram at a time."""

    def __init__(
        self, transport: asyncio.DatagramTransport, protocol: _Protocol, idle_timeout: float
    ) -> None:
        self._transport = transport
        self._protocol = protocol
        self._idle_timeout = idle_timeout
        self._active = asyncio.get_running_loop().time()
        self._ended = False

    @property
    def dropped(self) -> int:
        """Datagrams lost because the reader was behind."""
        return self._protocol.dropped

    async def read(self) -> bytes:
        """The next datagram; b"" once the stream ended (idle, ICMP error, closed)."""
        loop = asyncio.get_running_loop()
        while not self._ended:
            left = self._active + self._idle_timeout - loop.time()
            if left <= 0:
                self._ended = True
                break
            try:
                async with asyncio.timeout(left):
                    data = await self._protocol.queue.get()
            except TimeoutError:
                # A write may have kept the stream alive meanwhile: recompute.
                continue
            if data is None:
                self._ended = True
                break
            if not data:
                continue  # `write_eof` shortened the timeout: recompute it
            self._active = loop.time()
            return data
        return b""

    async def write(self, data: bytes) -> None:
        """Send `data` as one datagram; wait while the kernel buffer is full."""
        if self._transport.is_closing():
            raise ConnectionResetError("the udp socket is closed")
        await self._protocol.writable.wait()
        self._transport.sendto(data)
        self._active = asyncio.get_running_loop().time()

    async def write_eof(self) -> None:
        """Nothing more will be sent: wait at most `EOF_GRACE` for replies."""
        self._idle_timeout = min(self._idle_timeout, EOF_GRACE)
        self._active = asyncio.get_running_loop().time()
        if not self._protocol.queue.full():
            # Wake a pending read so that it waits the new, shorter time.
            self._protocol.queue.put_nowait(b"")

    async def close(self) -> None:
        """Close the socket."""
        self._transport.close()


async def dial(
    target: Target, *, idle_timeout: float = IDLE_TIMEOUT, queue_size: int = QUEUE_SIZE
) -> DatagramStream:
    """A UDP socket connected to a vetted target (no packet is sent)."""
    ep = target.endpoint
    queue: asyncio.Queue[bytes | None] = asyncio.Queue(queue_size)
    loop = asyncio.get_running_loop()
    try:
        transport, protocol = await loop.create_datagram_endpoint(
            lambda: _Protocol(queue), remote_addr=(target.address, ep.port)
        )
    except OSError as exc:
        raise BackendUnavailable(
            f"cannot connect to udp {target.address}:{ep.port}: {exc.strerror or exc}"
        ) from None
    return DatagramStream(transport, protocol, idle_timeout)
