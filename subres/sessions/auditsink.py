"""Session audit events to an HTTP sink: CloudEvents batches, spooled on disk until taken.

`--session-audit-webhook URL` sends every audit line (`sessions.audit`) as a
CloudEvents 1.0 event, several per request in the structured batch mode
(`Content-Type: application/cloudevents-batch+json`, a JSON array). Each
event is first appended to a spool on disk (`--session-audit-spool DIR`):
segment files of JSON lines, and a cursor naming what the sink acknowledged
with a 2xx. A sink that is down or slow holds nothing up: events wait in the
spool, the sender retries with a growing backoff, and a replica that restarts
on the same directory sends what its predecessor left. Delivery is at least
once (a batch whose answer was lost is sent again); the sink deduplicates by
`id`. The spool is bounded (`--session-audit-spool-max`): past it new events
are dropped, counted and said once in the logs, never a session ended.

A sink that answers 4xx other than 408 and 429 refuses the batch for good:
retrying would hold every later event behind it, so it is dropped, counted
and logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import aiohttp

from subres.serving.metrics import Metrics

__all__ = ["CONTENT_TYPE", "SinkSettings", "Spool", "WebhookSink", "cloudevent"]

log = logging.getLogger(__name__)

CONTENT_TYPE = "application/cloudevents-batch+json"
SEGMENT_BYTES = 1 << 20
"""A segment is closed and a new one begun past this size."""
BATCH_EVENTS = 500
BATCH_BYTES = 1 << 20
BACKOFF_FIRST = 0.5
BACKOFF_MAX = 30.0
SEND_TIMEOUT = 10.0
CLOSE_GRACE = 2.0
"""Seconds the sender gets at shutdown; what it cannot send stays spooled."""
_CURSOR = "cursor"
_SUFFIX = ".jsonl"


@dataclass(frozen=True)
class SinkSettings:
    """Where audit events go and where they wait."""

    url: str
    """The sink's URL (http or https)."""
    spool: Path
    """The directory events wait in (an emptyDir survives a container's restart)."""
    max_bytes: int = 256 << 20
    """Bytes the spool may hold before new events are dropped."""
    ca_file: Path | None = None
    """CA bundle that signs an https sink's certificate (the system's when None)."""
    token_file: Path | None = None
    """A bearer token sent with each request, read again on every retry."""


def cloudevent(*, source: str, stage: str, time: str | None, data: dict[str, Any]) -> bytes:
    """One audit line as a CloudEvents 1.0 event in JSON, one line."""
    event = {
        "specversion": "1.0",
        "id": uuid.uuid4().hex,
        "source": source,
        "type": f"dev.subres.session.{stage}",
        "time": time,
        "datacontenttype": "application/json",
        "data": data,
    }
    return json.dumps(event, separators=(",", ":")).encode() + b"\n"


@dataclass(frozen=True)
class Position:
    """A point in the spool: segment number and byte offset in it."""

    segment: int
    offset: int


class Spool:
    """Append-only segments of JSON lines and a cursor of what the sink took; thread-safe."""

    def __init__(self, directory: Path, *, max_bytes: int) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._dir = directory
        self._max = max_bytes
        self._lock = threading.Lock()
        self._cursor = self._read_cursor()
        segments = self._segments()
        # A new segment at every start: the last one may end in a line cut by a kill.
        self._current = max([*segments, self._cursor.segment]) + 1
        self._file = open(self._path(self._current), "ab")  # noqa: SIM115 (kept open)
        self._size = sum(map(self._size_of, segments)) - self._cursor.offset
        self.pending = sum(self._count(s) for s in segments) - self._lines_before_cursor()
        """Events spooled and not yet taken by the sink."""
        self.on_append: Callable[[], None] = lambda: None

    def append(self, event: bytes) -> bool:
        """Spool one event (a JSON line); False when the spool is full and it was dropped."""
        with self._lock:
            if self._size + len(event) > self._max:
                return False
            if self._file.tell() >= SEGMENT_BYTES:
                self._file.close()
                self._current += 1
                self._file = open(self._path(self._current), "ab")  # noqa: SIM115
            self._file.write(event)
            self._file.flush()
            self._size += len(event)
            self.pending += 1
        self.on_append()
        return True

    def read(self) -> tuple[list[bytes], Position]:
        """The events after the cursor (at most a batch) and the position after them."""
        with self._lock:
            events: list[bytes] = []
            at = self._cursor
            while True:
                at = self._read_segment(at, events)
                full = len(events) >= BATCH_EVENTS or sum(map(len, events)) >= BATCH_BYTES
                if full or at.segment >= self._current:
                    return events, at
                at = Position(at.segment + 1, 0)

    def _read_segment(self, at: Position, events: list[bytes]) -> Position:
        path = self._path(at.segment)
        if not path.exists():  # the first cursor names a segment never written
            return at
        size = sum(map(len, events))
        with open(path, "rb") as segment:
            segment.seek(at.offset)
            for line in segment:
                if not line.endswith(b"\n"):
                    break  # cut by a kill: never sent, as it was never whole
                events.append(line)
                size += len(line)
                at = Position(at.segment, at.offset + len(line))
                if len(events) >= BATCH_EVENTS or size >= BATCH_BYTES:
                    break
        return at

    def commit(self, position: Position, *, events: int) -> None:
        """The sink took everything before `position`: move the cursor, remove used segments."""
        with self._lock:
            taken = self._bytes_between(self._cursor, position)
            self._cursor = position
            cursor = self._dir / _CURSOR
            cursor.with_suffix(".new").write_text(f"{position.segment} {position.offset}\n")
            cursor.with_suffix(".new").replace(cursor)
            for segment in self._segments():
                if segment < position.segment:
                    self._path(segment).unlink(missing_ok=True)
            self._size -= taken
            self.pending -= events

    def close(self) -> None:
        with self._lock:
            self._file.close()

    def _bytes_between(self, start: Position, end: Position) -> int:
        if start.segment == end.segment:
            return end.offset - start.offset
        whole = sum(self._size_of(s) for s in range(start.segment, end.segment))
        return whole - start.offset + end.offset

    def _size_of(self, segment: int) -> int:
        try:
            return self._path(segment).stat().st_size
        except FileNotFoundError:
            return 0

    def _segments(self) -> list[int]:
        return sorted(int(p.stem) for p in self._dir.glob(f"*{_SUFFIX}") if p.stem.isdigit())

    def _path(self, segment: int) -> Path:
        return self._dir / f"{segment:020d}{_SUFFIX}"

    def _read_cursor(self) -> Position:
        with contextlib.suppress(OSError, ValueError):
            segment, offset = (self._dir / _CURSOR).read_text().split()
            return Position(int(segment), int(offset))
        return Position(0, 0)

    def _count(self, segment: int) -> int:
        with open(self._path(segment), "rb") as f:
            return sum(1 for line in f if line.endswith(b"\n"))

    def _lines_before_cursor(self) -> int:
        if not self._path(self._cursor.segment).exists():
            return 0
        with open(self._path(self._cursor.segment), "rb") as f:
            return f.read(self._cursor.offset).count(b"\n")


class _Outcome(Enum):
    SENT = "sent"
    RETRY = "retry"
    REFUSED = "refused"


class WebhookSink:
    """Sends spooled audit events to the sink, batch by batch, until closed."""

    def __init__(self, settings: SinkSettings, *, metrics: Metrics) -> None:
        self.settings = settings
        self.spool = Spool(settings.spool, max_bytes=settings.max_bytes)
        self._metrics = metrics
        self._wake = asyncio.Event()
        self._emptied = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._dropping = False

    def add(self, event: bytes) -> None:
        """Spool one event; any thread (the audit writer's)."""
        if self.spool.append(event):
            self._dropping = False
            return
        self._metrics.audit_dropped.labels("spool").inc()
        if not self._dropping:
            log.error("session audit events dropped: the spool is full (the sink is down?)")
        self._dropping = True

    async def start(self) -> None:
        loop = asyncio.get_running_loop()

        def wake() -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: the next start sends it
                loop.call_soon_threadsafe(self._wake.set)

        self.spool.on_append = wake
        context = ssl.create_default_context(
            cafile=str(self.settings.ca_file) if self.settings.ca_file else None
        )
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=context, limit=1),
            timeout=aiohttp.ClientTimeout(total=SEND_TIMEOUT),
        )
        self._metrics.audit_buffered.set(self.spool.pending)
        self._task = asyncio.create_task(self._run(), name="audit-sink")

    async def close(self) -> None:
        """Send what can be sent within `CLOSE_GRACE`; the rest waits for the next start."""
        if self._task is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._emptied.wait(), CLOSE_GRACE)
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._session is not None:
            await self._session.close()
        self.spool.on_append = lambda: None
        self.spool.close()

    async def _run(self) -> None:
        backoff = BACKOFF_FIRST
        while True:
            events, position = await asyncio.to_thread(self.spool.read)
            if not events:
                self._wake.clear()
                if self.spool.pending:  # appended between the read and the clear
                    continue
                self._emptied.set()
                await self._wake.wait()
                self._emptied.clear()
                continue
            outcome = await self._send(events)
            if outcome is _Outcome.RETRY:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)
                continue
            backoff = BACKOFF_FIRST
            await asyncio.to_thread(self.spool.commit, position, events=len(events))
            if outcome is _Outcome.SENT:
                self._metrics.audit_sent.inc(len(events))
            else:
                self._metrics.audit_dropped.labels("refused").inc(len(events))
            self._metrics.audit_buffered.set(self.spool.pending)

    async def _send(self, events: list[bytes]) -> _Outcome:
        assert self._session is not None
        body = b"[" + b",".join(e.rstrip(b"\n") for e in events) + b"]"
        headers = {"Content-Type": CONTENT_TYPE}
        if self.settings.token_file is not None:
            try:
                token = self.settings.token_file.read_text().strip()
            except OSError as exc:
                log.error("session audit sink: cannot read its token: %s", exc)
                return _Outcome.RETRY
            headers["Authorization"] = f"Bearer {token}"
        try:
            async with self._session.post(self.settings.url, data=body, headers=headers) as answer:
                status = answer.status
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            self._metrics.audit_failures.inc()
            log.warning("session audit sink %s: %s", self.settings.url, exc or type(exc).__name__)
            return _Outcome.RETRY
        if 200 <= status < 300:
            return _Outcome.SENT
        self._metrics.audit_failures.inc()
        if status in (408, 429) or status >= 500:
            log.warning("session audit sink %s answered %d", self.settings.url, status)
            return _Outcome.RETRY
        log.error(
            "session audit sink %s refused %d events with %d: dropped",
            self.settings.url,
            len(events),
            status,
        )
        return _Outcome.REFUSED
