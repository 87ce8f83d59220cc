"""What a session is of: a checked parent and its subresource (`Target`), and its unit.

A *unit* (`SessionKey`) is what one replica owns for all of them: a
console of a machine, its display, its USB slots. Its key names the parent
resource, the subresource, the namespace, the name and, for machines with
several, which one: a console's name (empty for the default console), a USB
slot's number.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from subres import fields
from subres.config import ParentSpec, SubresourceSpec
from subres.kube.status import StatusError
from subres.sessions.registry import SessionKey

__all__ = ["Target", "endpoint_url", "key"]


@dataclass(frozen=True)
class Target:
    """A parent object that passed its checks, and the subresource asked of it."""

    parent: ParentSpec
    spec: SubresourceSpec
    namespace: str
    name: str
    obj: Mapping[str, Any]
    """The object the subresource acts on (an `instance` parent's: its instance)."""
    uid: str = ""
    """The uid of the object the request names (the parent's own, even with an instance)."""

    def describe(self) -> str:
        """`Machine default/vm1`."""
        return f"{self.parent.kind} {self.namespace}/{self.name}"


def key(target: Target) -> SessionKey:
    """`target`'s unit: the exclusive slot of its subresource (a console of it, a USB slot),
    and what one replica owns. The one place a key is built from a request."""
    spec = target.spec
    return SessionKey(target.parent.resource, spec.name, target.namespace, target.name, spec.unit)


def endpoint_url(target: Target) -> str:
    """The backend URL the parent names for its subresource (400 when it has none)."""
    try:
        url = fields.read(target.spec.endpoint, target.obj)
    except fields.FieldError as exc:
        raise StatusError(
            400, f"{target.describe()} has no usable {target.spec.name} endpoint: {exc}"
        ) from None
    if not isinstance(url, str) or not url:
        raise StatusError(
            400, f"{target.describe()} has no {target.spec.name} ({target.spec.endpoint} is empty)"
        )
    return url
