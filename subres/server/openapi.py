"""OpenAPI v2 and v3 documents of the served subresources.

kube-apiserver merges `/openapi/v2` into its own spec and links
`/openapi/v3/apis/{group}/{version}` by hash; both are built once.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from subres.config import Config
from subres.server.discovery import VERBS, served

__all__ = ["Specs", "build"]

PRODUCES = {"screenshot": ["image/png"]}
METHODS = {"get": "get", "create": "post"}


@dataclass(frozen=True)
class Specs:
    """Serialized specs with their ETag (v2) and hash (v3)."""

    v2: bytes
    v2_etag: str
    v3_path: str
    """Group-version path under /openapi/v3/, e.g. `apis/subresources.subres.dev/v1alpha1`."""
    v3: bytes
    v3_hash: str

    def v3_index(self) -> bytes:
        """The `/openapi/v3` discovery document."""
        url = f"/openapi/v3/{self.v3_path}?hash={self.v3_hash}"
        return _dump({"paths": {self.v3_path: {"serverRelativeURL": url}}})


def build(config: Config) -> Specs:
    """The specs for `config`."""
    v2 = _dump(_swagger(config))
    v3 = _dump(_openapi3(config))
    digest = hashlib.sha512(v3).hexdigest().upper()
    return Specs(
        v2=v2,
        v2_etag=f'"{hashlib.sha512(v2).hexdigest().upper()}"',
        v3_path=f"apis/{config.group}/{config.version}",
        v3=v3,
        v3_hash=digest,
    )


def _operations(config: Config) -> dict[str, tuple[str, str, str]]:
    """Path → (kind, subresource, parent) for every served subresource."""
    base = f"/apis/{config.group}/{config.version}/namespaces/{{namespace}}"
    return {
        f"{base}/{p.resource}/{{name}}/{sub}": (p.kind, sub, p.resource)
        for p in config.parents
        for sub in served(p)
    }


def _params(in_v3: bool) -> list[dict[str, Any]]:
    def param(name: str, what: str) -> dict[str, Any]:
        schema: dict[str, Any] = {"schema": {"type": "string"}} if in_v3 else {"type": "string"}
        return {"name": name, "in": "path", "required": True, "description": what, **schema}

    return [
        param("name", "name of the parent object"),
        param("namespace", "object name and auth scope, such as for teams and projects"),
    ]


def _operation(config: Config, kind: str, sub: str, verb: str, v3: bool) -> dict[str, Any]:
    produces = PRODUCES.get(sub, ["*/*"])
    ok: dict[str, Any] = {"description": "OK"}
    if v3:
        ok["content"] = {t: {"schema": {"type": "string"}} for t in produces}
    else:
        ok["schema"] = {"type": "string"}
    op: dict[str, Any] = {
        "description": f"connect {verb.upper()} requests to {sub} of {kind}",
        "operationId": f"connect{verb.capitalize()}Namespaced{kind}{_camel(sub)}",
        "tags": [config.group],
        "responses": {"200": ok, "401": {"description": "Unauthorized"}},
        "x-kubernetes-action": "connect",
        "x-kubernetes-group-version-kind": {
            "group": config.group,
            "version": config.version,
            "kind": kind,
        },
    }
    if not v3:
        op["produces"] = produces
        op["schemes"] = ["https"]
    return op


def _paths(config: Config, v3: bool) -> dict[str, Any]:
    return {
        path: {
            **{
                METHODS[verb]: _operation(config, kind, sub, METHODS[verb], v3)
                for verb in VERBS.get(sub, ["get"])
            },
            "parameters": _params(v3),
        }
        for path, (kind, sub, _) in _operations(config).items()
    }


def _swagger(config: Config) -> dict[str, Any]:
    return {
        "swagger": "2.0",
        "info": {"title": "subres", "version": config.version},
        "paths": _paths(config, v3=False),
        "definitions": {},
    }


def _openapi3(config: Config) -> dict[str, Any]:
    return {
        "openapi": "3.0.0",
        "info": {"title": "subres", "version": config.version},
        "paths": _paths(config, v3=True),
        "components": {"schemas": {}},
    }


def _camel(name: str) -> str:
    """`console-observe` → `ConsoleObserve`."""
    return "".join(part.capitalize() for part in name.split("-"))


def _dump(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()
