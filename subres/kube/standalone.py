"""Standalone mode: parent objects read from a multi-document YAML file.

Feeds the same `ParentCache` a watch would, and re-reads the file when it
changes on disk, so a newcomer edits one file instead of running a cluster.
`Secret` documents (`apiVersion: v1`) in the same file go to a cache of their
own: the SSH credentials parents name.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from subres.config import ParentSpec
from subres.kube.cache import ParentCache

__all__ = ["FileSource"]

log = logging.getLogger(__name__)


class FileSource:
    """Loads parents from `path` into one cache per parent kind."""

    def __init__(
        self,
        path: Path,
        caches: Mapping[str, ParentCache],
        parents: Sequence[ParentSpec],
        *,
        secrets: ParentCache | None = None,
    ):
        self.path = path
        self._caches = caches
        self._kinds = {(p.api_version, p.kind): p.resource for p in parents}
        self._secrets = secrets
        self._stamp: tuple[int, int, int] | None = None
        self._reported: tuple[tuple[int, int, int] | None, str] | None = None
        """The file's stamp and problem last logged; None once it loads."""

    def reload_if_changed(self) -> bool:
        """Re-read the file when its stamp changed; keep the old objects if it is invalid.

        A problem (no file, bad YAML) is logged once per version of the file,
        not at every poll while the file stays as it is.
        """
        try:
            st = os.stat(self.path)
        except OSError as exc:
            self._stamp = None
            self._report(str(exc))
            return False
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            docs = [d for d in yaml.safe_load_all(self.path.read_text()) if d]
        except (OSError, yaml.YAMLError) as exc:
            self._report(f"not loaded, the objects read before stay: {exc}")
            return False
        self._reported = None
        self._load(docs)
        return True

    def _report(self, problem: str) -> None:
        if self._reported != (self._stamp, problem):
            self._reported = (self._stamp, problem)
            log.warning("standalone file %s: %s", self.path, problem)

    def _load(self, docs: list[Any]) -> None:
        by_resource: dict[str, list[Mapping[str, Any]]] = {r: [] for r in self._caches}
        secrets: list[Mapping[str, Any]] = []
        for doc in docs:
            if not isinstance(doc, dict):
                continue
            kind = (str(doc.get("apiVersion")), str(doc.get("kind")))
            resource = self._kinds.get(kind)
            if resource is not None:
                by_resource[resource].append(doc)
            elif kind == ("v1", "Secret"):
                secrets.append(doc)
        for resource, objects in by_resource.items():
            self._caches[resource].replace(objects)
        if self._secrets is not None:
            self._secrets.replace(secrets)
        log.info("standalone file %s: %d objects", self.path, sum(map(len, by_resource.values())))

    async def watch(self, interval: float = 1.0) -> None:
        """Poll the file for changes until cancelled."""
        while True:
            self.reload_if_changed()
            await asyncio.sleep(interval)
