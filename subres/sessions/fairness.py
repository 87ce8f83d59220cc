"""A fixed number of places shared between namespaces: each gets its share, none more than a cap.

Kept consoles are bounded per replica (`consoles.maxKept`). Taken in name
order, one namespace that annotates enough objects would take every place.
Here each namespace asks for as many as it has (at most `per_namespace`),
and places are handed out a round at a time, one to each namespace still
asking (max-min fairness): a namespace that wants few gets all it wants, the
others share the rest evenly. The last, partial round goes in namespace
order, and each namespace's own candidates in the order given, so every
replica chooses alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar

__all__ = ["share"]

T = TypeVar("T")


def share(
    candidates: Mapping[str, Sequence[T]], *, total: int, per_namespace: int
) -> dict[str, list[T]]:
    """The candidates chosen in each namespace: at most `per_namespace` each, `total` in all."""
    wanted = {ns: min(len(items), per_namespace) for ns, items in candidates.items()}
    granted = dict.fromkeys(wanted, 0)
    left = total
    while left > 0:
        asking = sorted(ns for ns in wanted if granted[ns] < wanted[ns])
        if not asking:
            break
        each = max(1, left // len(asking))
        for ns in asking:
            step = min(each, wanted[ns] - granted[ns], left)
            granted[ns] += step
            left -= step
            if left == 0:
                break
    return {ns: list(candidates[ns][:count]) for ns, count in granted.items() if count}
