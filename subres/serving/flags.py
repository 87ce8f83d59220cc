"""Flag values every program parses alike: Go-style durations."""

from __future__ import annotations

import argparse
import math
import re

__all__ = ["duration"]

_DURATION = re.compile(r"(\d+(?:\.\d*)?)(h|ms|m|s)")
_UNIT = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


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
