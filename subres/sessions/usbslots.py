"""A machine's USB redirection slots: which there are, and which a new client gets.

The parent kind's `usbredir.slots` caps how many slots a machine has
(KubeVirt's `UsbClientPassthroughMaxNumberOf`, 4 by default); its endpoint
names one URL per slot: a list, or a template with `{slot}`. Each slot is a
unit of its own (`SessionKey.unit` is its number) that takes one client at a
time. A new client gets the first free slot; when every slot is held it
takes over the one held longest, unless it asked to preserve: then 409. The
choice is made by the replica that owns the machine's USB redirection (the
unit without a slot), which holds the slots' claims.
"""

from __future__ import annotations

import dataclasses
import math

from subres import fields
from subres.config import SLOT, slot_source
from subres.kube.status import StatusError
from subres.sessions.registry import Sessions
from subres.sessions.target import Target, key

__all__ = ["choose", "slots"]


def slots(target: Target) -> list[tuple[Target, str]]:
    """Each USB slot of the parent, as a target of its own, with its URL (400 for none).

    The endpoint is read once per slot when it names `{slot}`; otherwise it
    holds one URL (one slot) or a list of them, of which the first `slots`.
    """
    spec = target.spec
    try:
        if SLOT in spec.endpoint:
            urls = [
                fields.read(slot_source(spec.endpoint, i), target.obj) for i in range(spec.slots)
            ]
        else:
            found = fields.read(spec.endpoint, target.obj)
            urls = found[: spec.slots] if isinstance(found, list) else [found]
    except fields.FieldError as exc:
        raise StatusError(
            400, f"{target.describe()} has no usable usbredir endpoint: {exc}"
        ) from None
    if not urls or urls == [None]:
        raise StatusError(
            400, f"{target.describe()} has no USB redirection ({spec.endpoint} is empty)"
        )
    if not all(isinstance(url, str) and url for url in urls):
        raise StatusError(400, f"{target.describe()}: {spec.endpoint} is not a list of URLs")
    return [
        (dataclasses.replace(target, spec=dataclasses.replace(spec, unit=str(i))), url)
        for i, url in enumerate(urls)
    ]


def choose(
    sessions: Sessions, target: Target, choices: list[tuple[Target, str]], *, preserve: bool
) -> tuple[Target, str]:
    """The first free slot; with none, the one held longest (409 when asked to preserve)."""
    for choice in choices:
        if not sessions.active(key(choice[0])):
            return choice
    if preserve:
        raise StatusError(
            409,
            f"all {len(choices)} USB slots of {target.describe()} are in use; "
            "connect without preserveSession=true to take one over",
        )

    def age(choice: tuple[Target, str]) -> float:
        since = sessions.since(key(choice[0]))
        return math.inf if since is None else since

    return min(choices, key=age)
