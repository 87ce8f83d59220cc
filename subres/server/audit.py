"""Session audit lines: one JSON object per session start and one per end.

Written to stdout by default (`--session-audit-log -`), where the container
runtime collects it apart from the logs: who (user, groups), what (machine,
subresource, mode, dialect), from where (client address, request id), when
(start, end), how much (bytes each way) and how it ended (close code and
reason). Each line is flushed as it is written; a failing stream is reported
once in the logs and never ends a session.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any, TextIO

from subres.server.units import rfc3339

__all__ = ["SessionAudit", "open_log"]

log = logging.getLogger(__name__)


class SessionAudit:
    """Writes audit lines to `stream`; with None, writes nothing."""

    def __init__(self, stream: TextIO | None) -> None:
        self.stream = stream
        self._failed = False

    def started(self, fields: dict[str, Any]) -> None:
        """A session began (`fields`: `session.Record.fields()`)."""
        self._write("start", fields)

    def ended(self, fields: dict[str, Any]) -> None:
        """A session ended."""
        self._write("end", fields)

    def _write(self, stage: str, fields: dict[str, Any]) -> None:
        if self.stream is None:
            return
        line = {
            "audit": "session",
            "stage": stage,
            **fields,
            "start": _time(fields.get("start")),
            "end": _time(fields.get("end")),
        }
        try:
            self.stream.write(json.dumps(line, separators=(",", ":")) + "\n")
            self.stream.flush()
        except (OSError, ValueError) as exc:
            if not self._failed:
                log.error("cannot write session audit lines: %s", exc)
            self._failed = True


def open_log(path: str) -> TextIO | None:
    """`--session-audit-log`: "-" is stdout, "" is none, anything else a file appended to."""
    if path == "-":
        return sys.stdout
    if not path:
        return None
    return open(path, "a", encoding="utf-8")


def _time(seconds: float | None) -> str | None:
    return None if seconds is None else rfc3339(seconds, fraction=True)
