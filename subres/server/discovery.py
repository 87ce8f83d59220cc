"""Discovery documents: APIGroupList, APIGroup, APIResourceList and aggregated v2.

Built once from the configuration; the aggregated document carries the ETag
kube-apiserver uses to poll it cheaply (quoted hex SHA-512 of the body).
Also the `…/{version}/version` document that KubeVirt's clients read.
"""

from __future__ import annotations

import hashlib
import json
import platform
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from typing import Any

from subres.config import Config, ParentSpec

__all__ = ["AGGREGATED_TYPES", "Documents", "build", "served", "wants_aggregated"]

VERBS = {
    "console": ["create", "get"],
    "console-observe": ["create", "get"],
    "console-moderate": ["create", "delete", "get"],
    "vnc-moderate": ["delete", "get"],
    "portforward": ["create", "get"],
}
"""WebSocket upgrades are GET, SPDY upgrades are POST; the others are GET only."""

SHARES = {"console": "console-observe", "vnc": "vnc-observe"}
"""The read-only subresource beside each interactive one: RBAC grants it on its own."""
MODERATED = {"console": "console-moderate", "vnc": "vnc-moderate"}
"""The moderator's subresource beside each interactive one, served when moderation is set."""
KINDS = {"sessions": "SessionList", "recordings": "RecordingList"}
"""Subresources that answer an object of their own kind rather than a stream."""

AGGREGATED_TYPES = {
    "v2": "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
    "v2beta1": "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList",
}


@dataclass(frozen=True)
class Body:
    """A serialized document with its ETag."""

    data: bytes
    etag: str


@dataclass(frozen=True)
class Documents:
    """Every discovery document the server answers with."""

    group_list: bytes
    group: bytes
    resource_list: bytes
    aggregated: dict[str, Body]
    """By discovery version (`v2`, `v2beta1`)."""
    version: bytes
    """`/apis/{group}/{version}/version`: the fields KubeVirt's `version.Info` has."""


def build(config: Config) -> Documents:
    """The documents for `config`."""
    return Documents(
        group_list=_dump({"kind": "APIGroupList", "apiVersion": "v1", "groups": [_group(config)]}),
        group=_dump({"kind": "APIGroup", "apiVersion": "v1", **_group(config)}),
        resource_list=_dump(_resource_list(config)),
        aggregated={v: _body(_aggregated(config, v)) for v in AGGREGATED_TYPES},
        version=_dump(_version(config)),
    )


def _version(config: Config) -> dict[str, str]:
    """subres's own version in KubeVirt's shape, with the fields the config sets instead."""
    try:
        own = package_version("subres")
    except PackageNotFoundError:
        own = "0.0.0"
    machine = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    return {
        "gitVersion": f"v{own}",
        "gitCommit": "",
        "gitTreeState": "",
        "buildDate": "",
        "goVersion": "",
        "compiler": platform.python_implementation().lower(),
        "platform": f"{platform.system().lower()}/{machine}",
        **config.server_version,
    }


def wants_aggregated(accept: str) -> str | None:
    """The aggregated discovery version an Accept header asks for first, if any."""
    for item in accept.split(","):
        params = dict(p.strip().split("=", 1) for p in item.split(";")[1:] if "=" in p)
        if (
            params.get("g") == "apidiscovery.k8s.io"
            and params.get("as") == "APIGroupDiscoveryList"
            and params.get("v") in AGGREGATED_TYPES
        ):
            return params["v"]
    return None


def _group(config: Config) -> dict[str, Any]:
    version = {"groupVersion": f"{config.group}/{config.version}", "version": config.version}
    return {"name": config.group, "versions": [version], "preferredVersion": version}


def _verbs(sub: str) -> list[str]:
    return VERBS.get(sub, ["get"])


def served(parent: ParentSpec, config: Config) -> list[str]:
    """Every subresource a parent kind has: the configured ones, their shares, and their
    moderators' when the configuration moderates any."""
    names: list[str] = []
    for sub in parent.subresources:
        names.append(sub)
        if sub in SHARES:
            names.append(SHARES[sub])
        if sub in MODERATED and config.moderation:
            names.append(MODERATED[sub])
    if "console" in parent.subresources:
        names.append("log")
    if {"console", "vnc"} & set(parent.subresources):
        names.append("recordings")
    return [*names, "sessions"]


def _resource_list(config: Config) -> dict[str, Any]:
    resources = [
        {
            "name": f"{parent.resource}/{sub}",
            "singularName": "",
            "namespaced": True,
            "kind": KINDS.get(sub, parent.kind),
            "verbs": _verbs(sub),
        }
        for parent in config.parents
        for sub in served(parent, config)
    ]
    resources.append(
        {
            "name": "sessions",
            "singularName": "session",
            "namespaced": True,
            "kind": "Session",
            "verbs": ["list"],
        }
    )
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{config.group}/{config.version}",
        "resources": resources,
    }


def _aggregated(config: Config, version: str) -> dict[str, Any]:
    return {
        "kind": "APIGroupDiscoveryList",
        "apiVersion": f"apidiscovery.k8s.io/{version}",
        "metadata": {},
        "items": [
            {
                "metadata": {"name": config.group, "creationTimestamp": None},
                "versions": [
                    {
                        "version": config.version,
                        "resources": [
                            *(_discovered(config, p) for p in config.parents),
                            _sessions(config),
                        ],
                        "freshness": "Current",
                    }
                ],
            }
        ],
    }


def _discovered(config: Config, parent: ParentSpec) -> dict[str, Any]:
    kind = {"group": config.group, "version": config.version, "kind": parent.kind}
    return {
        "resource": parent.resource,
        "responseKind": kind,
        "scope": "Namespaced",
        "singularResource": parent.singular,
        "verbs": [],
        "subresources": [
            {
                "subresource": sub,
                "responseKind": {**kind, "kind": KINDS.get(sub, parent.kind)},
                "verbs": _verbs(sub),
            }
            for sub in served(parent, config)
        ],
    }


def _sessions(config: Config) -> dict[str, Any]:
    return {
        "resource": "sessions",
        "responseKind": {"group": config.group, "version": config.version, "kind": "Session"},
        "scope": "Namespaced",
        "singularResource": "session",
        "verbs": ["list"],
    }


def _dump(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _body(obj: Any) -> Body:
    data = _dump(obj)
    return Body(data, f'"{hashlib.sha512(data).hexdigest()}"')
