"""Connection timeouts and the cap on unauthenticated connections, as Go's net/http has them.

aiohttp reaps nothing by itself before a request arrives: a TLS connection
that never sends one, or a client trickling header bytes (slowloris), stays
open for an hour. Every accepted connection therefore goes through a
`Guard` that wraps aiohttp's protocol and times it the way Go's `http.Server`
does:

- the TLS handshake must finish within `tls_handshake_timeout` (asyncio's
  `ssl_handshake_timeout`);
- from the handshake, or from the first byte after an idle pause, the whole
  request head must arrive within `request_header_timeout`;
- between requests a keep-alive connection may sit idle for
  `idle_timeout`;
- while a request is being handled (which includes a whole streaming
  session) no timer runs: sessions have their own pings.

The timers are stopped and restarted by the guard's middlewares around each
request, so a port served behind a guard must run them, or every upgraded
connection on it is reaped by the header timer. That holds by construction:
`Guard.application` is the one way to build an application with the
guard's middlewares, and `GuardedSite` serves only an application built so,
taking its guard from it (`GUARD`).

A connection is "unauthenticated" from its handshake until a request on it
passes authentication as someone other than `system:anonymous`. At most
`max_unauthenticated` of them are kept: when another arrives, the oldest is
closed, so a flood of idle connections churns instead of locking out the
clients that authenticate at once (as kube-apiserver does, within
milliseconds). A reaped connection is aborted: it owes us nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import enum
import logging
import resource
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import web
from aiohttp.typedefs import Middleware

from subres.serving.flags import duration

__all__ = [
    "GUARD",
    "Guard",
    "GuardedSite",
    "Limits",
    "add_arguments",
    "raise_open_files_limit",
]

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Limits:
    """The timeouts and the cap (flags of `subres serve` and `subres agent`: `add_arguments`)."""

    tls_handshake_timeout: float = 10.0
    """Seconds a client has to finish the TLS handshake (`--tls-handshake-timeout`)."""
    request_header_timeout: float = 32.0
    """Seconds to send a whole request head (`--request-header-timeout`, kube-apiserver's)."""
    idle_timeout: float = 90.0
    """Seconds a keep-alive connection may wait for its next request (`--idle-timeout`)."""
    max_unauthenticated: int = 1000
    """Connections kept before one authenticates (`--max-unauthenticated-connections`)."""

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> Limits:
        """The limits the flags of `add_arguments` gave."""
        return cls(
            tls_handshake_timeout=ns.tls_handshake_timeout,
            request_header_timeout=ns.request_header_timeout,
            idle_timeout=ns.idle_timeout,
            max_unauthenticated=ns.max_unauthenticated_connections,
        )

    def problems(self) -> list[str]:
        """What is wrong with these limits, by flag."""
        problems = [
            f"{flag} must be positive"
            for flag, seconds in (
                ("--tls-handshake-timeout", self.tls_handshake_timeout),
                ("--request-header-timeout", self.request_header_timeout),
                ("--idle-timeout", self.idle_timeout),
            )
            if seconds <= 0
        ]
        if self.max_unauthenticated < 1:
            problems.append("--max-unauthenticated-connections must be at least 1")
        return problems


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Timeouts and the cap of every connection, as Go's http.Server has them."""
    add = parser.add_argument
    default = Limits()
    add(
        "--tls-handshake-timeout",
        type=duration,
        default=default.tls_handshake_timeout,
        help="time a client has to finish the TLS handshake (default 10s)",
    )
    add(
        "--request-header-timeout",
        type=duration,
        default=default.request_header_timeout,
        help="time a client has to send a whole request head, from the handshake or the "
        "first byte of a keep-alive request; slowloris protection (default 32s)",
    )
    add(
        "--idle-timeout",
        type=duration,
        default=default.idle_timeout,
        help="time a keep-alive connection may wait for its next request (default 90s)",
    )
    add(
        "--max-unauthenticated-connections",
        type=int,
        default=default.max_unauthenticated,
        help="connections kept before a request on them authenticates; beyond it the "
        "oldest is closed (default 1000)",
    )


class Phase(enum.Enum):
    """Where a connection is, and so which timer runs."""

    HEAD = "request-header-timeout"
    BUSY = "busy"
    IDLE = "idle-timeout"


class Guard:
    """Every connection past its TLS handshake, with its phase and its timer."""

    def __init__(self, limits: Limits = Limits()) -> None:
        self.limits = limits
        self.reaped: Counter[str] = Counter()
        """Connections closed by a timer or the cap, by reason."""
        self.on_level: Callable[[str, int], None] | None = None
        """Told how many `connections` are open after one closes, and how many
        `handshakes` are in progress after one ends (memory reclaim hooks here)."""
        self._open: dict[asyncio.BaseTransport, _Guarded] = {}
        # asyncio says nothing of a handshake that fails: one not finished by its
        # deadline (the handshake timeout, enforced by asyncio) has ended anyway.
        self._handshaking: dict[_Guarded, asyncio.TimerHandle] = {}
        # Insertion-ordered: the first is the oldest, closed first beyond the cap.
        self._unauthenticated: dict[_Guarded, None] = {}

    @property
    def open(self) -> int:
        """Connections past the TLS handshake and not closed."""
        return len(self._open)

    @property
    def handshaking(self) -> int:
        """Connections accepted whose TLS handshake has neither finished nor timed out."""
        return len(self._handshaking)

    @property
    def unauthenticated(self) -> int:
        """Of those, the ones no request has authenticated yet."""
        return len(self._unauthenticated)

    def wrap(self, factory: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        """A protocol factory whose connections this guard times."""
        return lambda: self._accepted(_Guarded(self, factory()))

    def _accepted(self, guarded: _Guarded) -> _Guarded:
        loop = asyncio.get_running_loop()
        # A little past asyncio's own deadline, so the handshake has surely ended.
        deadline = self.limits.tls_handshake_timeout + 1.0
        self._handshaking[guarded] = loop.call_later(deadline, self._handshook, guarded)
        return guarded

    def _handshook(self, guarded: _Guarded) -> None:
        timer = self._handshaking.pop(guarded, None)
        if timer is not None:
            timer.cancel()
            self._tell("handshakes", len(self._handshaking))

    def application(
        self,
        middlewares: list[Middleware],
        *,
        authenticated: Callable[[web.Request], bool],
        **settings: Any,
    ) -> web.Application:
        """An application whose connections this guard times, for `GuardedSite`.

        `middlewares` (which authenticate) run between the guard's two: the
        outermost stops the connection's timer while a request is handled
        (an upgraded session included); the innermost, which only requests
        that passed authentication reach, marks the connection authenticated
        when `authenticated(request)` says so. `settings` are aiohttp's.
        """
        app = web.Application(middlewares=self._around(middlewares, authenticated), **settings)
        app[GUARD] = self
        return app

    def _around(
        self, middlewares: list[Middleware], authenticated: Callable[[web.Request], bool]
    ) -> list[Middleware]:

        @web.middleware
        async def mark(request: web.Request, handler: Handler) -> web.StreamResponse:
            guarded = self._open.get(request.transport) if request.transport else None
            if guarded is not None and authenticated(request):
                self._unauthenticated.pop(guarded, None)
            return await handler(request)

        return [self._request_middleware, *middlewares, mark]

    @web.middleware
    async def _request_middleware(
        self, request: web.Request, handler: Handler
    ) -> web.StreamResponse:
        guarded = self._open.get(request.transport) if request.transport else None
        if guarded is None:
            return await handler(request)
        guarded.enter(Phase.BUSY)
        try:
            return await handler(request)
        finally:
            guarded.enter(Phase.IDLE)

    def _tell(self, what: str, level: int) -> None:
        if self.on_level is not None:
            self.on_level(what, level)

    def _admit(self, guarded: _Guarded, transport: asyncio.BaseTransport) -> None:
        self._handshook(guarded)
        while len(self._unauthenticated) >= self.limits.max_unauthenticated:
            oldest = next(iter(self._unauthenticated))
            oldest.reap("evicted")
        self._open[transport] = guarded
        self._unauthenticated[guarded] = None

    def _forget(self, guarded: _Guarded, transport: asyncio.BaseTransport) -> None:
        if self._open.pop(transport, None) is not None:
            self._tell("connections", len(self._open))
        self._unauthenticated.pop(guarded, None)


GUARD = web.AppKey("guard", Guard)
"""The guard an application was built by (`Guard.application`)."""


class _Guarded(asyncio.Protocol):
    """aiohttp's protocol for one connection, with this connection's timer around it."""

    # One per connection: no instance dict.
    __slots__ = ("_guard", "_inner", "_lost", "_phase", "_timer", "_transport")

    def __init__(self, guard: Guard, inner: asyncio.Protocol) -> None:
        self._guard = guard
        self._inner = inner
        self._transport: asyncio.Transport | None = None
        self._phase = Phase.HEAD
        self._timer: asyncio.TimerHandle | None = None
        self._lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not subclasses of asyncio.Transport, only alike.
        self._transport = cast(asyncio.Transport, transport)
        self._guard._admit(self, transport)
        self._arm(self._guard.limits.request_header_timeout)
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._phase is Phase.IDLE:
            # Go starts the header clock at the first byte of the next request.
            self.enter(Phase.HEAD)
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._cancel()
        if self._transport is not None:
            self._guard._forget(self, self._transport)
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def enter(self, phase: Phase) -> None:
        """Switch phase and timer: BUSY has none, HEAD and IDLE their timeouts."""
        self._phase = phase
        limits = self._guard.limits
        if phase is Phase.BUSY:
            self._cancel()
        else:
            timeout = limits.request_header_timeout if phase is Phase.HEAD else limits.idle_timeout
            self._arm(timeout)

    def reap(self, reason: str) -> None:
        """Close the connection now, counting why."""
        self._cancel()
        self._guard.reaped[reason] += 1
        if self._transport is not None:
            self._guard._forget(self, self._transport)
            self._transport.abort()

    def _arm(self, timeout: float) -> None:
        self._cancel()
        if self._lost:
            # A handler cancelled by the lost connection ends after it: a timer now
            # would keep the dead connection's objects alive until it fired.
            return
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(timeout, self._expired)

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        log.debug("closing a connection: %s", self._phase.value)
        self.reap(self._phase.value)


class GuardedSite(web.BaseSite):
    """aiohttp's TCP site with the guard around every connection and a TLS handshake timeout.

    The guard is the one `runner`'s application was built by
    (`Guard.application`): a port cannot be guarded without the middlewares
    that stop its timers (`TypeError` otherwise).
    """

    def __init__(
        self,
        runner: web.AppRunner,
        *,
        host: str,
        port: int,
        ssl_context: Any,
        backlog: int,
    ) -> None:
        guard = runner.app.get(GUARD)
        if guard is None:
            raise TypeError("a guarded site serves only an application built by its guard")
        super().__init__(runner, ssl_context=ssl_context, backlog=backlog)
        self._guard = guard
        self._host = host
        self._port = port

    @property
    def name(self) -> str:
        """`https://host:port`, as aiohttp's TCPSite names itself."""
        return f"https://{self._host}:{self._port}"

    async def start(self) -> None:
        """Listen; each accepted connection gets the guard's protocol."""
        await super().start()
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            self._guard.wrap(server),
            self._host,
            self._port,
            ssl=self._ssl_context,
            backlog=self._backlog,
            ssl_handshake_timeout=self._guard.limits.tls_handshake_timeout,
        )


def raise_open_files_limit() -> None:
    """Let each session's two sockets count against the hard limit, not the soft 1024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
