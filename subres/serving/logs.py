"""How `serve` and `demo` log: text for people, or JSON as Kubernetes components write it.

`--logging-format=json` writes one JSON object per line, shaped like the
structured logs of kube-apiserver and other components (component-base's
JSON format): `ts` (milliseconds since the epoch, a float), `caller`
(`dir/file.py:line`), `msg`, `v` (verbosity: 0 for info and warnings, 4 for
debug) or, for errors, `err`; then the record's key/value pairs. Code logs
key/values with `extra={"fields": {...}}` (the session-end line does); they
are merged into the object, without replacing the keys above. The text format
shows the message with its control characters escaped (`\n` as `\x0a`):
messages carry what users chose (a user name from a certificate or a token
review, a machine's name), and a newline there must not forge a line.

Libraries log at INFO what only their authors need (asyncssh writes some
twenty lines per console session) and warn about what only their authors can
fix, so below ERROR only subres's own records, and the access log the
operator asked for, are written unless `-v` asks for everyone's
(`third_party`). A library's error still shows: something failed.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

__all__ = ["OWN", "JsonFormatter", "TextFormatter", "configure", "own_or_error"]

TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
DEBUG_VERBOSITY = 4
_RESERVED = frozenset({"ts", "caller", "msg", "v", "err"})
OWN = ("subres", "aiohttp.access")
"""Loggers whose INFO records are always written: ours, and the opt-in access log."""
_CONTROLS = {
    c: f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"
    for c in [*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029]
}
"""C0 and C1 controls, DEL and Unicode's line and paragraph separators, as escapes."""


class TextFormatter(logging.Formatter):
    """Lines for people (`TEXT`), one per record whatever its message holds.

    A traceback, which the formatter adds itself, keeps its lines.
    """

    def __init__(self) -> None:
        super().__init__(TEXT)

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging names it)
        """The line, control characters escaped."""
        return super().formatMessage(record).translate(_CONTROLS)


class JsonFormatter(logging.Formatter):
    """One JSON object per record, as Kubernetes components' `--logging-format=json`."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": record.created * 1000,
            "caller": f"{_short(record.pathname)}:{record.lineno}",
            "msg": record.getMessage(),
        }
        if record.levelno >= logging.ERROR:
            entry["err"] = _error(record)
        else:
            entry["v"] = 0 if record.levelno >= logging.INFO else DEBUG_VERBOSITY
        entry["logger"] = record.name
        fields = getattr(record, "fields", None)
        if isinstance(fields, Mapping):
            entry.update((str(k), v) for k, v in fields.items() if str(k) not in _RESERVED)
        if record.exc_info:
            entry["stacktrace"] = self.formatException(record.exc_info)
        # Anything json cannot write (a Path, an enum) is written as its text.
        return json.dumps(entry, default=str, ensure_ascii=False)


def _short(pathname: str) -> str:
    parts = PurePath(pathname).parts
    return "/".join(parts[-2:])


def _error(record: logging.LogRecord) -> str:
    if record.exc_info and record.exc_info[1] is not None:
        exc = record.exc_info[1]
        return f"{type(exc).__name__}: {exc}"
    return record.getMessage()


def configure(*, level: int, logging_format: str, third_party: bool = False) -> None:
    """Send the root logger's records to stderr in `logging_format` at `level`.

    Other libraries' records below ERROR are dropped unless `third_party`.
    """
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if logging_format == "json" else TextFormatter())
    if not third_party:
        handler.addFilter(own_or_error)
    logging.basicConfig(level=level, handlers=[handler], force=True)


def own_or_error(record: logging.LogRecord) -> bool:
    """Whether a record is written without `-v`: subres's own, or anyone's error."""
    return record.levelno >= logging.ERROR or any(
        record.name == own or record.name.startswith(f"{own}.") for own in OWN
    )
