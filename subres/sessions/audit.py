"""Session audit lines: one JSON object per session start and one per end.

Written to stdout by default (`--session-audit-log -`), where the container
runtime collects it apart from the logs: who (user, groups), what (machine,
subresource, mode, dialect), from where (client address, request id), when
(start, end), how much (bytes each way) and how it ended (close code and
reason). With a sink (`sessions.auditsink`), each line also goes there as
a CloudEvent. A thread of its own writes and flushes the lines, so a stream that
blocks (a full pipe nobody reads) never holds up a session or the event
loop; past `MAX_PENDING` lines waiting, new ones are dropped (counted, and
said once in the logs). A failing stream is reported once in the logs and
never ends a session.
"""

from __future__ import annotations

import json
import logging
import queue
import sys
import threading
from typing import Any, TextIO

from subres.serving.units import rfc3339
from subres.sessions.auditsink import WebhookSink, cloudevent

__all__ = ["MAX_PENDING", "SessionAudit", "open_log"]

log = logging.getLogger(__name__)

MAX_PENDING = 10_000
"""Lines that may wait for a slow stream before new ones are dropped."""
CLOSE_GRACE = 2.0
"""Seconds the lines still waiting at shutdown get to leave."""


class SessionAudit:
    """Writes audit lines to `stream` and `sink` from a thread; with neither, writes nothing."""

    def __init__(
        self, stream: TextIO | None, *, sink: WebhookSink | None = None, source: str = "subres"
    ) -> None:
        self.stream = stream
        self.sink = sink
        self.source = source
        """The CloudEvents `source` of the sink's events (the replica)."""
        self.dropped = 0
        """Lines dropped because too many waited."""
        self._lines: queue.Queue[tuple[str, bytes | None] | None] = queue.Queue(MAX_PENDING)
        self._writer: threading.Thread | None = None
        self._failed = False

    def started(self, fields: dict[str, Any]) -> None:
        """A session began (`fields`: `session.Record.fields()`)."""
        self._write("start", fields)

    def ended(self, fields: dict[str, Any]) -> None:
        """A session ended."""
        self._write("end", fields)

    def _write(self, stage: str, fields: dict[str, Any]) -> None:
        if self.stream is None and self.sink is None:
            return
        line = {
            "audit": "session",
            "stage": stage,
            **fields,
            "start": _time(fields.get("start")),
            "end": _time(fields.get("end")),
        }
        event = None
        if self.sink is not None:
            time = line["end"] if stage == "end" else line["start"]
            event = cloudevent(source=self.source, stage=stage, time=time, data=line)
        try:
            self._lines.put_nowait((json.dumps(line, separators=(",", ":")) + "\n", event))
        except queue.Full:
            if not self.dropped:
                log.error("session audit lines dropped: the audit stream does not keep up")
            self.dropped += 1
            return
        if self._writer is None:
            self._writer = threading.Thread(target=self._run, name="audit", daemon=True)
            self._writer.start()

    def _run(self) -> None:
        while (item := self._lines.get()) is not None:
            line, event = item
            if event is not None and self.sink is not None:
                self.sink.add(event)
            if self.stream is None:
                continue
            try:
                self.stream.write(line)
                self.stream.flush()
            except (OSError, ValueError) as exc:
                if not self._failed:
                    log.error("cannot write session audit lines: %s", exc)
                self._failed = True

    def close(self) -> None:
        """Let the waiting lines leave (within `CLOSE_GRACE`), then stop the writer."""
        if self._writer is None:
            return
        try:
            self._lines.put(None, timeout=CLOSE_GRACE)
        except queue.Full:
            return
        self._writer.join(CLOSE_GRACE)
        self._writer = None


def open_log(path: str) -> TextIO | None:
    """`--session-audit-log`: "-" is stdout, "" is none, anything else a file appended to."""
    if path == "-":
        return sys.stdout
    if not path:
        return None
    return open(path, "a", encoding="utf-8")


def _time(seconds: float | None) -> str | None:
    return None if seconds is None else rfc3339(seconds, fraction=True)
