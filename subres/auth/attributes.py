"""Request attributes for authorization, read from the path and method.

Follows kube-apiserver's RequestInfo rules: `/apis/{group}/{version}/namespaces/
{ns}/{resource}/{name}/{subresource}/…`; everything else is a non-resource path.
A GET that names no object is a `list`, or a `watch` when `?watch=` is true as
Go's `strconv.ParseBool` reads it (anything else is a list, as kube-apiserver's
RequestInfo has it), exactly as kube-apiserver authorized it before proxying
the request here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["Attributes", "from_request", "parse_bool"]

TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})

VERBS = {
    "GET": "get",
    "HEAD": "get",
    "POST": "create",
    "PUT": "update",
    "PATCH": "patch",
    "DELETE": "delete",
    "OPTIONS": "options",
}


@dataclass(frozen=True)
class Attributes:
    """What a request asks to do, in SubjectAccessReview terms."""

    verb: str
    path: str
    resource_request: bool = False
    group: str = ""
    version: str = ""
    namespace: str = ""
    resource: str = ""
    subresource: str = ""
    name: str = ""

    def describe(self) -> str:
        """A phrase for error messages, e.g. `get machines/console in namespace "ns"`."""
        if not self.resource_request:
            return f'{self.verb} path "{self.path}"'
        what = f"{self.resource}/{self.subresource}" if self.subresource else self.resource
        where = f' in the namespace "{self.namespace}"' if self.namespace else ""
        return f'{self.verb} resource "{what}" in API group "{self.group}"{where}'


def parse_bool(text: str) -> bool | None:
    """`text` as Go's `strconv.ParseBool` reads it; None when it reads no boolean."""
    return True if text in TRUE else False if text in FALSE else None


def from_request(method: str, path: str, query: Mapping[str, str] | None = None) -> Attributes:
    """Attributes of `method path?query`."""
    verb = VERBS.get(method.upper(), method.lower())
    parts = [p for p in path.split("/") if p]
    if len(parts) < 4 or parts[0] != "apis":
        return Attributes(verb=verb, path=path)
    group, version, rest = parts[1], parts[2], parts[3:]
    namespace = ""
    if rest[0] == "namespaces" and len(rest) >= 3:
        namespace, rest = rest[1], rest[2:]
    name = rest[1] if len(rest) > 1 else ""
    if not name and verb == "get":
        verb = "watch" if parse_bool((query or {}).get("watch", "")) else "list"
    return Attributes(
        verb=verb,
        path=path,
        resource_request=True,
        group=group,
        version=version,
        namespace=namespace,
        resource=rest[0],
        name=name,
        subresource=rest[2] if len(rest) > 2 else "",
    )
