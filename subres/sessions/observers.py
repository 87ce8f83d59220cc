"""How many observers may watch: per console or display, and per replica.

An observer costs memory while it watches: a console observer may have up
to `session.observerBacklog` bytes queued before it is cut off, a display
observer holds a VNC connection and its buffers. Read-only rights are enough
to attach, and 300 observers that never read took a replica past its
512 MiB limit. So each observer (and each `log?follow=true` reader, which
costs as much) takes a slot before its upgrade, refused
when its console or display already has `maxObserversPerConsole` observers
or the replica `maxObservers`, and gives it back when its backend (its feed,
its display connection) is closed, which every session's end does.
"""

from __future__ import annotations

import collections
from collections.abc import Hashable

__all__ = ["Observers", "Slot", "TooManyObservers"]


class TooManyObservers(Exception):
    """No slot is free; the message says which bound was reached."""


class Slot:
    """One observer's place, held until `release`."""

    __slots__ = ("_key", "_observers")

    def __init__(self, observers: Observers, key: Hashable) -> None:
        self._observers: Observers | None = observers
        self._key = key

    def release(self) -> None:
        """Give the place back; again is nothing."""
        if self._observers is not None:
            self._observers._release(self._key)
            self._observers = None


class Observers:
    """The observers of one replica, counted per console or display and in all."""

    def __init__(self, *, per_target: int, total: int) -> None:
        self.per_target = per_target
        self.total = total
        self._counts: collections.Counter[Hashable] = collections.Counter()
        self._all = 0

    def watching(self, key: Hashable) -> int:
        """Observers of `key` now."""
        return self._counts[key]

    @property
    def all(self) -> int:
        """Observers of every console and display of this replica now."""
        return self._all

    def take(self, key: Hashable, *, what: str) -> Slot:
        """A place to watch `key` (`what` names it in a refusal), or `TooManyObservers`."""
        if self._counts[key] >= self.per_target:
            raise TooManyObservers(
                f"{what} has {self._counts[key]} observers, the most one may have "
                "(session.maxObserversPerConsole)"
            )
        if self._all >= self.total:
            raise TooManyObservers(
                f"this replica serves {self._all} observers, the most it may (session.maxObservers)"
            )
        self._counts[key] += 1
        self._all += 1
        return Slot(self, key)

    def _release(self, key: Hashable) -> None:
        self._counts[key] -= 1
        if not self._counts[key]:
            del self._counts[key]
        self._all -= 1
