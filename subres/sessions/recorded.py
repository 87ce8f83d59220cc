"""Whether a console's sessions are recorded, and where: settled before any upgrade.

A console whose recording cannot be kept (its namespace's recordings, or all
of them, are full) refuses new sessions with 503 rather than run unrecorded:
for a console recorded `always` the recording is an audit, and everyone else
was promised one by the banner. A parent whose name cannot be a folder
(standalone objects are not validated by an apiserver) is a 400.
"""

from __future__ import annotations

from subres.kube.status import StatusError
from subres.sessions import recordfiles
from subres.sessions.runtime import Runtime
from subres.sessions.target import Target

__all__ = ["check", "folder"]


def folder(target: Target) -> recordfiles.Folder:
    """Where `target`'s console recordings live (400 when it cannot be a folder)."""
    try:
        return recordfiles.folder(
            namespace=target.namespace,
            resource=target.parent.resource,
            name=target.name,
            uid=target.uid,
        )
    except ValueError as exc:
        raise StatusError(400, f"{target.describe()}: {exc}") from None


def check(state: Runtime, target: Target) -> None:
    """Nothing when `target`'s sessions may start as to recording; a Status otherwise."""
    if not state.recordings.wanted(target.spec, target.obj):
        return
    folder(target)
    if why := state.recordings.full(target.namespace):
        raise StatusError(503, f"{target.describe()} is recorded and {why}")
