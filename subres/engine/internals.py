"""The one place that touches private internals of our dependencies.

subres needs five things no public API of aiohttp, asyncio, asyncssh or
websockets offers:

- `take_over`: the bytes after our own `101` for SPDY/3.1, which aiohttp does
  not know (its request handler's `set_parser`, as its own WebSocket
  support uses it);
- `drain`: waiting for that connection's write buffer to drain
  (`_drain_helper` of aiohttp's protocol);
- `share_ssl_read_buffer`: one TLS read buffer per process instead of
  asyncio's 256 KiB per connection (`asyncio.sslproto.SSLProtocol`);
- `send_window`: how much an SSH server lets us send now (asyncssh's
  channel counter `_send_window`), so a forward waits for window instead of
  queueing without bound;
- `unmask`: websockets' C routine that XORs a WebSocket payload with its
  mask (`websockets.speedups.apply_mask`), reading any buffer and writing
  new bytes: the server's one pass over what a client uploads.

On import, `check` verifies the shape each aiohttp and asyncio detail relies
on and raises `InternalsChanged` naming what moved, so a changed dependency
stops the server at start instead of failing on a live session;
`check_asyncssh` does the same for asyncssh when the SSH backend is imported
(the CLI never imports asyncssh). uvloop's internals are read nowhere: its
version is only checked, where `subres.serving.loops` starts it.
`tests/engine/test_internals.py` drives every one against the real objects.
`pyproject.toml` bounds the versions this was written for (`TESTED`).
"""

from __future__ import annotations

import importlib.metadata
import logging
from asyncio import sslproto
from typing import Any

from aiohttp import web
from aiohttp.base_protocol import BaseProtocol
from aiohttp.web_protocol import RequestHandler

try:
    from websockets import speedups
except ImportError:  # a build without its C extension: `check` names it
    speedups = None  # type: ignore[assignment]

__all__ = [
    "TESTED",
    "InternalsChanged",
    "check",
    "check_asyncssh",
    "check_version",
    "drain",
    "send_window",
    "share_ssl_read_buffer",
    "take_over",
    "unmask",
]

log = logging.getLogger(__name__)

TESTED = {
    "aiohttp": ((3, 14), (3, 15)),
    "asyncssh": ((2, 17), (2, 25)),
    "uvloop": ((0, 21), (0, 24)),
    "websockets": ((13, 0), (18, 0)),
}
"""Versions (from, up to but excluding) whose internals this module was checked against."""


class InternalsChanged(ImportError):
    """A private detail subres relies on is not where it was; the message names it."""


def take_over(request: web.Request, parser: Any) -> None:
    """From now on every byte of `request`'s connection goes to `parser`, not to HTTP.

    `parser` has `feed_data(bytes) -> (False, b"")` and `feed_eof()`; call
    this before the `101` leaves, and the connection takes no further request.
    """
    request.protocol.set_parser(parser)
    request.protocol.keep_alive(False)


async def drain(request: web.Request) -> None:
    """Wait while the connection's write buffer is above its high-water mark."""
    await request.protocol._drain_helper()


def unmask(data: memoryview, mask: bytes) -> bytes:
    """`data` XOR the repeated 4-byte `mask`, as new bytes (SSE2 in C)."""
    return speedups.apply_mask(data, mask)


def share_ssl_read_buffer() -> None:
    """Give every TLS connection in this process one shared socket read buffer.

    asyncio (3.11 to 3.13) gives each TLS connection its own zero-filled 256 KiB
    buffer for socket reads: 256 of the ~300 KiB an idle console session costs.
    The buffer only holds bytes between `recv_into` and the copy into the
    connection's MemoryBIO, both in one synchronous callback on the loop thread,
    so one buffer serves every connection. Idempotent.
    """
    protocol = sslproto.SSLProtocol
    if getattr(protocol, "_subres_shared_buffer", False):
        return
    shared = bytearray(protocol.max_size)
    view = memoryview(shared)
    original = protocol.__init__

    def init(self: sslproto.SSLProtocol, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self._ssl_buffer = shared  # type: ignore[attr-defined]
        self._ssl_buffer_view = view  # type: ignore[attr-defined]

    protocol.__init__ = init  # type: ignore[method-assign]
    protocol._subres_shared_buffer = True  # type: ignore[attr-defined]


def send_window(channel: object) -> int | None:
    """How many bytes the SSH server lets an asyncssh channel send now; None when unknown."""
    window = getattr(channel, "_send_window", None)
    return window if isinstance(window, int) else None


def check_asyncssh() -> None:
    """Raise `InternalsChanged` unless asyncssh's channel still keeps `_send_window`."""
    from asyncssh.channel import SSHChannel

    if "_send_window" not in SSHChannel.__init__.__code__.co_names:
        raise InternalsChanged(
            "private internals subres relies on are gone: asyncssh SSHChannel._send_window"
        )
    check_version("asyncssh")


def check_version(package: str) -> None:
    """Log a warning when `package` is outside the versions `TESTED` names for it."""
    text = importlib.metadata.version(package)
    version = tuple(int(p) for p in text.split(".")[:2] if p.isdigit())
    low, high = TESTED[package]
    if not low <= version < high:
        log.warning(
            "%s %s is outside the versions subres's internals were checked against (%s)",
            package,
            text,
            "{}.{} to before {}.{}".format(*low, *high),
        )


def check() -> None:
    """Raise `InternalsChanged` unless every detail above is where this module expects it."""
    expected = {
        "aiohttp RequestHandler.set_parser": hasattr(RequestHandler, "set_parser"),
        "aiohttp RequestHandler.keep_alive": hasattr(RequestHandler, "keep_alive"),
        "aiohttp BaseProtocol._drain_helper": hasattr(BaseProtocol, "_drain_helper"),
        "asyncio SSLProtocol.max_size": isinstance(
            getattr(sslproto.SSLProtocol, "max_size", None), int
        ),
        "asyncio SSLProtocol._ssl_buffer_view": "_ssl_buffer_view"
        in sslproto.SSLProtocol.__init__.__code__.co_names,
        "websockets speedups.apply_mask": callable(getattr(speedups, "apply_mask", None)),
    }
    if missing := [name for name, present in expected.items() if not present]:
        raise InternalsChanged(f"private internals subres relies on are gone: {', '.join(missing)}")
    check_version("aiohttp")
    check_version("websockets")


check()
