"""Kubernetes Events on the parent object when a console, display or USB session opens and closes.

`kubectl describe machine vm1` then shows "Console opened by alice" and
"Console of alice closed after 5m (1.2 MiB): …". Events are best effort: they
are queued without waiting and posted by one background task, limited per
object (a token bucket as client-go's spam filter: 25 at once, then one per
5 minutes) and overall (a bounded queue); whatever is dropped or refused is
counted and logged, and never reaches a session. Port-forward connections
make no Events (each forwarded connection is a session; they would drown
the rest). Standalone mode has no apiserver and makes none.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from subres.kube import client
from subres.serving.metrics import Metrics
from subres.serving.units import human_age, human_bytes, rfc3339
from subres.sessions.registry import UNIT_WORDS

__all__ = ["EventApi", "EventSettings", "Events", "KubeEvents", "NoEvents", "closed", "opened"]

log = logging.getLogger(__name__)

COMPONENT = "subres"
WHAT = {
    ("console", "writer"): "Console",
    ("console", "observer"): "Console (read-only)",
    ("vnc", "viewer"): "VNC",
    ("vnc", "observer"): "VNC (view-only)",
    ("console", "moderator"): "Console moderation",
    ("vnc", "moderator"): "VNC moderation",
    ("usbredir", "redirector"): "USB redirection",
}
REASONS = {"console": "Console", "vnc": "VNC", "usbredir": "USBRedir"}


class Events(Protocol):
    """Where session Events go."""

    def emit(self, obj: Mapping[str, Any], *, reason: str, message: str) -> None:
        """Record an Event about `obj` (the parent object), without waiting."""

    async def close(self) -> None:
        """Send what is queued (briefly), then stop."""


class EventApi(Protocol):
    """What posting Events needs of an apiserver client (`kube.client.Api`)."""

    async def create_event(
        self, namespace: str, body: dict[str, Any], *, request_timeout: float
    ) -> dict[str, Any]:
        """POST an Event."""
        ...


class NoEvents:
    """Standalone mode: there is no apiserver to tell."""

    def emit(self, obj: Mapping[str, Any], *, reason: str, message: str) -> None:
        """Nothing."""

    async def close(self) -> None:
        """Nothing."""


def _what(fields: Mapping[str, Any]) -> str | None:
    """`Console`, `Console serial1 (read-only)`, `USB redirection slot 0`…, or None."""
    what = WHAT.get((fields["subresource"], fields["mode"]))
    unit = fields.get("unit")
    if what is None or not unit:
        return what
    noun, paren, rest = what.partition(" (")
    return f"{noun} {UNIT_WORDS.get(fields['subresource'], '')}{unit}{paren}{rest}"


def opened(fields: Mapping[str, Any]) -> tuple[str, str] | None:
    """Reason and message for a session that started (`Record.fields()`), or None."""
    what = _what(fields)
    if what is None:
        return None
    return f"{REASONS[fields['subresource']]}Opened", f"{what} opened by {fields['user']}"


def closed(fields: Mapping[str, Any]) -> tuple[str, str] | None:
    """Reason and message for a session that ended, or None."""
    what = _what(fields)
    if what is None:
        return None
    seconds = (fields["end"] or fields["start"]) - fields["start"]
    size = human_bytes(fields["bytesUp"] + fields["bytesDown"])
    message = f"{what} of {fields['user']} closed after {human_age(seconds)} ({size})"
    if fields.get("moderatedBy"):
        message += f", moderated by {', '.join(fields['moderatedBy'])}"
    if fields["reason"]:
        message += f": {fields['reason']}"
    return f"{REASONS[fields['subresource']]}Closed", message


@dataclass(frozen=True)
class EventSettings:
    """Limits on Events."""

    # (Settings as the webhooks' and the informer's are: only the shape is shared.)

    burst: int = 25
    """Events one object may get at once."""
    refill: float = 300.0
    """Seconds before an object may get one more once its burst is spent."""
    queue: int = 1000
    """Events waiting to be sent at most; more are dropped."""
    timeout: float = 10.0
    """Seconds one POST may take."""
    close_grace: float = 2.0
    """Seconds queued Events still get to leave at shutdown."""


class KubeEvents:
    """Events posted to the main apiserver by one task, started on the first Event."""

    def __init__(
        self,
        api: EventApi,
        *,
        metrics: Metrics,
        settings: EventSettings = EventSettings(),
        instance: str = "",
    ) -> None:
        self._api = api
        self._metrics = metrics
        self._settings = settings
        self._queue: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue(settings.queue)
        self._buckets: dict[str, tuple[float, float]] = {}
        self._task: asyncio.Task[None] | None = None
        self._instance = instance or socket.gethostname()

    def emit(self, obj: Mapping[str, Any], *, reason: str, message: str) -> None:
        """Queue an Event about `obj`, unless its rate or the queue is exhausted."""
        meta = obj.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        if not self._take(uid or str(meta.get("name"))):
            self._metrics.events_dropped.labels("rate").inc()
            return
        namespace = str(meta.get("namespace") or "default")
        try:
            self._queue.put_nowait((namespace, self._event(obj, reason=reason, message=message)))
        except asyncio.QueueFull:
            self._metrics.events_dropped.labels("queue").inc()
            return
        if self._task is None:
            self._task = asyncio.create_task(self._send(), name="events")

    def _take(self, key: str) -> bool:
        """Spend one of `key`'s tokens, if it has one."""
        now = time.monotonic()
        tokens, since = self._buckets.get(key, (float(self._settings.burst), now))
        tokens = min(self._settings.burst, tokens + (now - since) / self._settings.refill)
        if tokens < 1:
            self._buckets[key] = (tokens, now)
            return False
        self._buckets[key] = (tokens - 1, now)
        if len(self._buckets) > 4 * self._settings.queue:
            self._forget_full(now)
        return True

    def _forget_full(self, now: float) -> None:
        """Drop buckets that refilled: they say nothing a new bucket would not."""
        full = self._settings.burst * self._settings.refill
        self._buckets = {k: v for k, v in self._buckets.items() if now - v[1] < full}

    def _event(self, obj: Mapping[str, Any], *, reason: str, message: str) -> dict[str, Any]:
        meta = obj.get("metadata") or {}
        stamp = rfc3339(time.time())
        involved = {
            "apiVersion": obj.get("apiVersion", ""),
            "kind": obj.get("kind", ""),
            "name": meta.get("name", ""),
            "namespace": meta.get("namespace", ""),
            "uid": meta.get("uid", ""),
            "resourceVersion": meta.get("resourceVersion", ""),
        }
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{meta.get('name')}.{time.time_ns():x}"},
            "involvedObject": involved,
            "reason": reason,
            "message": message,
            "type": "Normal",
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": self._instance,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }

    async def _send(self) -> None:
        while True:
            namespace, body = await self._queue.get()
            try:
                await self._api.create_event(
                    namespace, body, request_timeout=self._settings.timeout
                )
            except client.ApiError as exc:
                self._metrics.events_failed.inc()
                log.warning("event %s not recorded: %s", body["reason"], exc)
            finally:
                self._queue.task_done()

    async def close(self) -> None:
        """Give queued Events `close_grace` seconds, then stop sending."""
        if self._task is None:
            return
        try:
            async with asyncio.timeout(self._settings.close_grace):
                await self._queue.join()
        except TimeoutError:
            log.warning("%d events not sent before shutdown", self._queue.qsize())
        self._task.cancel()
        await asyncio.wait([self._task])
