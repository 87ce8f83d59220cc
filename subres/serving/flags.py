"""Flag values every program parses alike: Go-style durations, Kubernetes-style sizes."""

from __future__ import annotations

import argparse
import math
import re

__all__ = ["duration", "size"]

_DURATION = re.compile(r"(\d+(?:\.\d*)?)(h|ms|m|s)")
_UNIT = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
_SIZE = re.compile(r"(\d+)(Ki|Mi|Gi|)")
_SIZE_UNIT = {"": 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}


def duration(text: str) -> float:
    """Seconds in a Go-style duration (`10s`, `1m30s`, `500ms`) or a plain number."""
    try:
        seconds = float(text)
    except ValueError:
        parts = _DURATION.findall(text)
        if not parts or "".join(n + u for n, u in parts) != text:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a duration such as 10s or 1m"
            ) from None
        seconds = sum(float(n) * _UNIT[u] for n, u in parts)
    if not math.isfinite(seconds):
        # A timer of inf or nan seconds fails when it is armed, long after the flags were read.
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite duration")
    return seconds


def size(text: str) -> int:
    """Bytes in a size such as `256Mi`, `64Ki` or a plain number, as Kubernetes quantities."""
    found = _SIZE.fullmatch(text)
    if found is None or int(found[1]) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size such as 256Mi")
    return int(found[1]) * _SIZE_UNIT[found[2]]
