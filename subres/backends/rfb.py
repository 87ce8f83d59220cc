"""Reading one framebuffer from a VNC server over a `ByteStream`, within a deadline.

Drives the sans-I/O `protocol.rfb.ScreenshotClient`: writes what it queues,
feeds it what the server sends, and stops at the first complete framebuffer.
The deadline covers the whole exchange, so a server that accepts and then
says nothing costs at most `deadline` seconds; the error names the phase it
was stuck in.
"""

from __future__ import annotations

import asyncio

from subres.engine.stream import ByteStream
from subres.protocol import rfb
from subres.protocol.rfb import FramebufferCaptured, Limits, ScreenshotClient

__all__ = ["CaptureFailed", "CaptureTimedOut", "capture"]


class CaptureFailed(Exception):
    """The VNC server refused, broke the protocol, or closed the connection early."""


class CaptureTimedOut(Exception):
    """The VNC server did not deliver a framebuffer in time; the message says where it stopped."""


async def capture(
    stream: ByteStream, *, deadline: float, limits: Limits | None = None
) -> FramebufferCaptured:
    """The server's framebuffer, read over `stream` (which the caller closes)."""
    client = ScreenshotClient(limits=limits or Limits())
    try:
        async with asyncio.timeout(deadline):
            return await _exchange(stream, client)
    except TimeoutError:
        raise CaptureTimedOut(
            f"no framebuffer within {deadline:g}s ({client.phase.value})"
        ) from None
    except rfb.RfbError as exc:
        raise CaptureFailed(str(exc)) from None
    except OSError as exc:
        raise CaptureFailed(f"connection failed while {client.phase.value}: {exc}") from None


async def _exchange(stream: ByteStream, client: ScreenshotClient) -> FramebufferCaptured:
    while True:
        if out := client.data_to_send():
            await stream.write(out)
        data = await stream.read()
        if not data:
            raise CaptureFailed(f"the VNC server closed the connection while {client.phase.value}")
        for event in client.receive_data(data):
            if isinstance(event, FramebufferCaptured):
                return event
