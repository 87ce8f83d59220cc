"""The in-memory cache of parent objects that the request path reads.

Fed by a watch of the main apiserver or, in standalone mode, by a file; the
request path only ever calls `get`, which never waits on anything. Whoever
follows every object (the console keeper) is called after each change.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["ParentCache"]

Key = tuple[str, str]


class ParentCache:
    """Parent objects of one kind, keyed by namespace and name."""

    def __init__(self, resource: str) -> None:
        self.resource = resource
        self._objects: dict[Key, Mapping[str, Any]] = {}
        self.synced = False
        """True once a full listing has been loaded."""
        self._followers: list[Callable[[], None]] = []

    def get(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The cached object, or None."""
        return self._objects.get((namespace, name))

    def objects(self) -> Iterable[Mapping[str, Any]]:
        """Every cached object (a view: take a list before awaiting)."""
        return self._objects.values()

    def follow(self, changed: Callable[[], None]) -> None:
        """Call `changed` (which must not block) after every change."""
        self._followers.append(changed)

    def replace(self, objects: Iterable[Mapping[str, Any]]) -> None:
        """Swap in a complete listing (after a list, a relist or a file read)."""
        self._objects = {_key(obj): obj for obj in objects}
        self.synced = True
        self._changed()

    def upsert(self, obj: Mapping[str, Any]) -> None:
        """Add or change one object (a watch ADDED or MODIFIED event)."""
        self._objects[_key(obj)] = obj
        self._changed()

    def delete(self, obj: Mapping[str, Any]) -> None:
        """Forget one object (a watch DELETED event)."""
        self._objects.pop(_key(obj), None)
        self._changed()

    def _changed(self) -> None:
        for changed in self._followers:
            changed()

    def __len__(self) -> int:
        return len(self._objects)


def _key(obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace") or "default"), str(meta.get("name") or ""))
