"""Times and sizes as people read them in tables, messages and audit lines."""

from __future__ import annotations

import datetime

__all__ = ["human_age", "human_bytes", "rfc3339"]


def rfc3339(seconds: float, *, fraction: bool = False) -> str:
    """`2024-05-01T10:02:03Z`, or with microseconds `2024-05-01T10:02:03.123456Z`."""
    moment = datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ" if fraction else "%Y-%m-%dT%H:%M:%SZ")


def human_bytes(size: int) -> str:
    """`512 B`, `1.2 KiB`, `3.4 MiB`, `5.6 GiB`."""
    amount = float(size)
    for unit in ("B", "KiB", "MiB"):
        if amount < 1024:
            return f"{size} B" if unit == "B" else f"{amount:.1f} {unit}"
        amount /= 1024
    return f"{amount:.1f} GiB"


def human_age(seconds: float) -> str:
    """An age as kubectl prints it: `45s`, `3m12s`, `25m`, `5h3m`, `20h`, `3d4h`, `12d`."""
    s = max(0, int(seconds))
    minutes, hours, days = s // 60, s // 3600, s // 86400
    steps = (
        (120, f"{s}s", 0, ""),
        (600, f"{minutes}m", s % 60, "s"),
        (3 * 3600, f"{minutes}m", 0, ""),
        (8 * 3600, f"{hours}h", minutes % 60, "m"),
        (48 * 3600, f"{hours}h", 0, ""),
        (8 * 86400, f"{days}d", hours % 24, "h"),
    )
    for below, large, small, unit in steps:
        if s < below:
            return f"{large}{small}{unit}" if small else large
    return f"{days}d"
