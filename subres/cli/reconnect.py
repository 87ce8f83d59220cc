"""Reconnecting client verbs: which ends to reconnect after, and retrying with backoff.

`subres console` and `subres port-forward` reconnect by themselves when the
server says it is going away (close code 1001: a replica draining on
SIGTERM, its sessions to move to another replica) or the connection is
lost, and say so on stderr; `--no-reconnect` turns that off. A takeover
(4001), a backend failure (1011) or a normal end (1000) never reconnects:
someone meant it. `virtctl` does not reconnect at all.

While reconnecting, an unreachable server and the refusals that pass (409,
503) are tried again. So are 401 and 403 while kube-apiserver says it is not
ready: restarted, it serves before its RBAC is loaded, and until then it
denies everyone (a SubjectAccessReview answers `{"allowed": false}`, no
reason, nothing to tell it from a real denial but `/readyz`). Once it is
ready, a 401 or 403 is believed at once: a real one is never hidden.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import TypeVar

from subres.cli import api
from subres.cli.api import CommandError, ServerError, Unreachable
from subres.cli.kubeconfig import ClientConfig

__all__ = [
    "WINDOW",
    "Drops",
    "Pacing",
    "apiserver_ready",
    "dropped",
    "reconnecting",
    "retrying",
    "worth_reconnecting",
]

T = TypeVar("T")

GOING_AWAY = 1001
ABNORMAL = 1006
"""What a WebSocket library reports for a connection that ended without a close frame."""
WINDOW = 60.0
"""Seconds a verb keeps trying to reconnect: long enough for a rollout to bring up a pod."""
STABLE = 10.0
"""A connection that lasted this long was a success: the next drop starts afresh."""
FIRST_BACKOFF = 0.5
MAX_BACKOFF = 5.0
UNREACHABLE_BACKOFF = 2.0
"""Longest pause while nothing answers: a refused connection costs the server nothing, and
the sooner a restarted one is seen listening the sooner the pauses start again small."""
PASSING = frozenset({409, 503})
"""Refusals that may pass: not running yet, no backend or replica available yet."""
DENIALS = frozenset({401, 403})
"""Refusals that pass only while kube-apiserver is not ready (its RBAC still loading)."""
READY_TIMEOUT = 5.0
MAX_READY_BODY = 1 << 16


def dropped(code: int | None, reason: str | None) -> str | None:
    """Why a WebSocket that ended with close `code` is worth reconnecting; None if it is not."""
    if code == GOING_AWAY:
        return f"{reason or 'the server is going away'} (1001)"
    if code is None or code == ABNORMAL:
        return "lost the connection to the server"
    return None


async def worth_reconnecting(config: ClientConfig, exc: CommandError) -> bool:
    """An unreachable server, a refusal that may pass, or a denial by a kube-apiserver
    that is not ready yet: worth another try while reconnecting."""
    if isinstance(exc, Unreachable):
        return True
    if not isinstance(exc, ServerError):
        return False
    if exc.code in PASSING:
        return True
    return exc.code in DENIALS and not await apiserver_ready(config)


def reconnecting(
    config: ClientConfig, say: Callable[[str], None]
) -> Callable[[CommandError], Awaitable[bool]]:
    """`worth_reconnecting` for one reconnection, saying (once) why a denial is tried again."""
    said = False

    async def worth_it(exc: CommandError) -> bool:
        nonlocal said
        if not await worth_reconnecting(config, exc):
            return False
        if isinstance(exc, ServerError) and exc.code in DENIALS and not said:
            said = True
            say(f"{exc.message} (kube-apiserver is not ready yet)")
        return True

    return worth_it


async def apiserver_ready(config: ClientConfig) -> bool:
    """Does kube-apiserver answer its `/readyz` with 200 (to us, as we are)?

    A restarted kube-apiserver answers 500 until its RBAC and informers are
    loaded, and 403 to anyone but its masters before RBAC is: both are "not
    ready", as is not answering at all.
    """
    try:
        url = f"{config.server}/readyz"
        await api.get(config, url, max_body=MAX_READY_BODY, request_timeout=READY_TIMEOUT)
    except CommandError:
        return False
    return True


async def retrying(
    attempt: Callable[[], Awaitable[T]],
    *,
    within: float,
    worth_it: Callable[[CommandError], Awaitable[bool]],
    waiting: Callable[[CommandError], None] | None = None,
) -> T:
    """`attempt()`, again after failures `worth_it` with growing pauses, for `within` seconds.

    A failure unlike the last (refused, then 503: the server is coming back)
    starts the pauses small again. `waiting` is told of the first failure
    that will be retried. The last failure is raised once the time is up.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    delay = FIRST_BACKOFF
    last: int | None = None
    while True:
        try:
            return await attempt()
        except CommandError as exc:
            remaining = deadline - loop.time()
            if not await worth_it(exc) or remaining <= 0:
                raise
            if waiting is not None:
                waiting(exc)
                waiting = None
            kind = exc.code if isinstance(exc, ServerError) else 0
            if kind != last:
                delay, last = FIRST_BACKOFF, kind
            longest = UNREACHABLE_BACKOFF if isinstance(exc, Unreachable) else MAX_BACKOFF
            # Backoff between attempts, not synchronisation: the server has no event to wait on.
            await asyncio.sleep(min(delay, longest, remaining))
            delay = min(delay * 2, MAX_BACKOFF)


class Pacing:
    """Reconnections in a row: each waits longer than the last, all of them within `WINDOW`.

    A server that accepts and at once goes away again (every replica
    draining) is not hammered: the first reconnection is immediate, the
    following ones back off, and a connection that lasted `STABLE` seconds
    starts a new row.
    """

    def __init__(self) -> None:
        self._row_started: float | None = None
        self._delay = 0.0

    async def next(self, *, lasted: float) -> float:
        """Wait before the next reconnection; the seconds left for it (none left: give up)."""
        loop = asyncio.get_running_loop()
        if self._row_started is None or lasted >= STABLE:
            self._row_started, self._delay = loop.time(), 0.0
        # Pacing between connections, not synchronisation: nothing signals a server's return.
        await asyncio.sleep(self._delay)
        self._delay = min(max(self._delay * 2, FIRST_BACKOFF), MAX_BACKOFF)
        return self._row_started + WINDOW - loop.time()


class Drops:
    """What a long-running verb does when the server goes away or the connection is lost.

    With `reconnect` it says so on stderr and goes on; without, `why` keeps
    the first loss and `stop` is set: the verb ends with it.
    """

    def __init__(self, *, reconnect: bool) -> None:
        self.reconnect = reconnect
        self.stop = asyncio.Event()
        """Set to end the verb: by a loss without `reconnect`, or by whoever else owns it."""
        self.why: str | None = None

    def dropped(self, what: str, *, then: str) -> None:
        """`what` was lost; `then` says what happens next when reconnecting."""
        if self.reconnect:
            print(f"{what}; {then}", file=sys.stderr, flush=True)
        elif self.why is None:
            self.why = what
            self.stop.set()
