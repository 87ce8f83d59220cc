"""OpenAPI v2 and v3 documents of the served subresources and the `Session` reads.

kube-apiserver merges `/openapi/v2` into its own spec and links
`/openapi/v3/apis/{group}/{version}` by hash; both are built once.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from subres.config import Config
from subres.server.discovery import KINDS, VERBS, served

__all__ = ["Specs", "build"]

PRODUCES = {"screenshot": ["image/png"]}
CONSOLE = "which of the machine's consoles (default: its default one)"
LOG_PARAMETERS = (
    ("follow", "boolean", "keep the answer open and send new output as it arrives"),
    ("tailLines", "integer", "only the last this many lines"),
    ("sinceSeconds", "integer", "only lines that began this many seconds ago or later"),
    ("sinceTime", "string", "only lines that began at or after this RFC 3339 time"),
    ("limitBytes", "integer", "at most this many bytes in the answer"),
    ("timestamps", "boolean", "lead each line with the time its first byte arrived"),
    ("previous", "boolean", "the connection before the console was last dialed again"),
    ("console", "string", CONSOLE),
)
"""The query options of `log`, as `pods/log` has them (and `console`)."""
CHOSEN = ("console", "console-observe")
"""The streams that take `?console=`."""
METHODS = {"get": "get", "create": "post", "delete": "delete"}


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
        for sub in served(p, config)
    }


def _param(name: str, what: str, v3: bool, *, where: str = "path") -> dict[str, Any]:
    schema: dict[str, Any] = {"schema": {"type": "string"}} if v3 else {"type": "string"}
    return {"name": name, "in": where, "required": where == "path", "description": what, **schema}


def _params(v3: bool, *, named: bool = True) -> list[dict[str, Any]]:
    namespace = _param(
        "namespace", "object name and auth scope, such as for teams and projects", v3
    )
    return [_param("name", "name of the parent object", v3), namespace] if named else [namespace]


def _gvk(config: Config, kind: str) -> dict[str, str]:
    return {"group": config.group, "version": config.version, "kind": kind}


def _ref(config: Config, kind: str, v3: bool) -> dict[str, str]:
    where = "#/components/schemas/" if v3 else "#/definitions/"
    return {"$ref": where + _definition(config, kind)}


def _definition(config: Config, kind: str) -> str:
    """`dev.subres.subresources.v1alpha1.Session`: reversed group, version, kind."""
    return ".".join([*reversed(config.group.split(".")), config.version, kind])


def _ok(schema: dict[str, Any], types: list[str], v3: bool) -> dict[str, Any]:
    if v3:
        return {"description": "OK", "content": {t: {"schema": schema} for t in types}}
    return {"description": "OK", "schema": schema}


def _operation(config: Config, kind: str, sub: str, verb: str, v3: bool) -> dict[str, Any]:
    produces = PRODUCES.get(sub, ["*/*"])
    op: dict[str, Any] = {
        "description": f"connect {verb.upper()} requests to {sub} of {kind}",
        "operationId": f"connect{verb.capitalize()}Namespaced{kind}{_camel(sub)}",
        "tags": [config.group],
        "responses": {
            "200": _ok({"type": "string"}, produces, v3),
            "401": {"description": "Unauthorized"},
        },
        "x-kubernetes-action": "connect",
        "x-kubernetes-group-version-kind": _gvk(config, kind),
    }
    if not v3:
        op["produces"] = produces
        op["schemes"] = ["https"]
    return op


def _log(config: Config, kind: str, v3: bool) -> dict[str, Any]:
    """GET a kept console's output as text."""
    query = []
    for name, kind_of, what in LOG_PARAMETERS:
        schema = {"type": kind_of}
        query.append(
            {"name": name, "in": "query", "description": what, "uniqueItems": True}
            | ({"schema": schema} if v3 else schema)
        )
    op: dict[str, Any] = {
        "description": f"read the output of a {kind}'s kept console",
        "operationId": f"readNamespaced{kind}Log",
        "tags": [config.group],
        "parameters": query,
        "responses": {
            "200": _ok({"type": "string"}, ["text/plain"], v3),
            "401": {"description": "Unauthorized"},
        },
        "x-kubernetes-action": "get",
        "x-kubernetes-group-version-kind": _gvk(config, kind),
    }
    if not v3:
        op["produces"] = ["text/plain"]
        op["schemes"] = ["https"]
    return op


def _read(
    config: Config, *, operation: str, what: str, v3: bool, kind: str = "SessionList"
) -> dict[str, Any]:
    """A GET answering a list (`SessionList`, `RecordingList`)."""
    op: dict[str, Any] = {
        "description": what,
        "operationId": operation,
        "tags": [config.group],
        "responses": {
            "200": _ok(_ref(config, kind, v3), ["application/json"], v3),
            "401": {"description": "Unauthorized"},
        },
        "x-kubernetes-action": "list",
        "x-kubernetes-group-version-kind": _gvk(config, kind.removesuffix("List")),
    }
    if not v3:
        op["produces"] = ["application/json"]
        op["schemes"] = ["https"]
    return op


def _paths(config: Config, v3: bool) -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for path, (kind, sub, _) in _operations(config).items():
        if sub == "log":
            paths[path] = {"get": _log(config, kind, v3), "parameters": _params(v3)}
            continue
        if sub in KINDS:
            what = f"list the {sub} of a {kind}"
            operation = f"readNamespaced{kind}{_camel(sub)}"
            paths[path] = {
                "get": _read(config, operation=operation, what=what, v3=v3, kind=KINDS[sub]),
                "parameters": _params(v3),
            }
            continue
        chosen = [_param("console", CONSOLE, v3, where="query")] if sub in CHOSEN else []
        paths[path] = {
            **{
                METHODS[verb]: _operation(config, kind, sub, METHODS[verb], v3)
                for verb in VERBS.get(sub, ["get"])
            },
            "parameters": [*_params(v3), *chosen],
        }
    prefix = f"/apis/{config.group}/{config.version}"
    for path, operation, where, namespaced in (
        (
            f"{prefix}/namespaces/{{namespace}}/sessions",
            "listNamespacedSession",
            "a namespace",
            True,
        ),
        (f"{prefix}/sessions", "listSessionForAllNamespaces", "every namespace", False),
    ):
        what = f"list the live sessions in {where}"
        paths[path] = {"get": _read(config, operation=operation, what=what, v3=v3)}
        if namespaced:
            paths[path]["parameters"] = _params(v3, named=False)
    return paths


def _schemas(config: Config, v3: bool) -> dict[str, Any]:
    text = {"type": "string"}
    count = {"type": "integer", "format": "int64"}
    session = {
        "description": "A live streaming session on one replica.",
        "type": "object",
        "properties": {
            "apiVersion": text,
            "kind": text,
            "metadata": {"type": "object"},
            "parent": {
                "type": "object",
                "properties": {"apiVersion": text, "kind": text, "name": text},
            },
            "subresource": text,
            "unit": {
                **text,
                "description": "which console (by name) or USB slot (by number) of the machine",
            },
            "mode": {
                **text,
                "description": "writer, observer, viewer, forwarder or redirector",
            },
            "user": text,
            "dialect": text,
            "clientAddress": text,
            "since": {**text, "format": "date-time"},
            "bytesUp": count,
            "bytesDown": count,
            "recorded": {"type": "boolean"},
            "replica": text,
        },
        "x-kubernetes-group-version-kind": [_gvk(config, "Session")],
    }
    recording = {
        "description": "A recorded console session (asciicast v2), read at …/recordings/NAME.",
        "type": "object",
        "properties": {
            "name": text,
            "size": count,
            "started": {**text, "format": "date-time"},
            "modified": {**text, "format": "date-time"},
            "title": text,
        },
    }
    return {
        _definition(config, "Session"): session,
        _definition(config, "SessionList"): _sessions(config, v3),
        _definition(config, "Recording"): recording,
        _definition(config, "RecordingList"): _list(
            config, "Recording", "A machine's recorded console sessions, newest first.", v3
        ),
    }


def _sessions(config: Config, v3: bool) -> dict[str, Any]:
    """A SessionList; a machine's also names its consoles."""
    schema = _list(config, "Session", "Live sessions.", v3)
    consoles = "a machine's consoles, the default first (`?console=NAME` picks one)"
    schema["properties"]["consoles"] = {
        "type": "array",
        "items": {"type": "string"},
        "description": consoles,
    }
    return schema


def _list(config: Config, kind: str, what: str, v3: bool) -> dict[str, Any]:
    """The schema of a `KindList`."""
    text = {"type": "string"}
    return {
        "description": what,
        "type": "object",
        "required": ["items"],
        "properties": {
            "apiVersion": text,
            "kind": text,
            "metadata": {"type": "object"},
            "items": {"type": "array", "items": _ref(config, kind, v3)},
        },
        "x-kubernetes-group-version-kind": [_gvk(config, f"{kind}List")],
    }


def _swagger(config: Config) -> dict[str, Any]:
    return {
        "swagger": "2.0",
        "info": {"title": "subres", "version": config.version},
        "paths": _paths(config, v3=False),
        "definitions": _schemas(config, v3=False),
    }


def _openapi3(config: Config) -> dict[str, Any]:
    return {
        "openapi": "3.0.0",
        "info": {"title": "subres", "version": config.version},
        "paths": _paths(config, v3=True),
        "components": {"schemas": _schemas(config, v3=True)},
    }


def _camel(name: str) -> str:
    """`console-observe` → `ConsoleObserve`."""
    return "".join(part.capitalize() for part in name.split("-"))


def _dump(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()
