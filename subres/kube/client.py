"""Clients of the main apiserver, and the typed calls subres makes on them.

Owns the one place `kubernetes_asyncio` is used: building an `ApiClient` from
a kubeconfig file or the in-cluster ServiceAccount, and every request subres
sends (list and watch of custom objects, ConfigMaps and Leases, reading a
Secret, TokenReview, SubjectAccessReview, the Lease writes of session
coordination, and Events). The library is untyped; everything leaving this module is
plain JSON (`dict`), an `ApiError`, or a stream of `WatchEvent`s.

Responses are read raw (`_preload_content=False`) so that status codes,
Status bodies and watch streams are handled here, the same way for every call.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import aiohttp
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8sconfig

__all__ = [
    "Api",
    "ApiError",
    "ConfigMaps",
    "CustomObjects",
    "Leases",
    "ListWatch",
    "Page",
    "Pods",
    "WatchEvent",
    "connect",
    "status_error",
]

JSON = dict[str, Any]

REQUEST_TIMEOUT = 10.0
"""Seconds a single non-watch request may take (as kube's delegating authn uses)."""

MAX_EVENT_BYTES = 16 << 20
"""Longest watch event line accepted; a larger one is a broken stream."""


class ApiError(Exception):
    """The apiserver answered with an error, or could not be reached (status 0)."""

    def __init__(self, status: int, message: str, *, reason: str = "") -> None:
        super().__init__(f"{status} {reason}: {message}" if reason else f"{status}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Page:
    """One page of a list call."""

    items: list[JSON]
    """The objects on this page."""
    resource_version: str
    """`metadata.resourceVersion` of the list: where a following watch starts."""
    continue_token: str
    """Token for the next page; empty on the last one."""


@dataclass(frozen=True)
class WatchEvent:
    """One line of a watch stream."""

    type: str
    """ADDED, MODIFIED, DELETED, BOOKMARK or ERROR."""
    object: JSON = field(default_factory=dict)
    """The object (a Status for ERROR)."""


class ListWatch(Protocol):
    """A collection that can be listed page by page and watched."""

    async def list(self, *, limit: int, continue_token: str) -> Page:
        """One page of the collection."""
        ...

    def watch(
        self, *, resource_version: str, timeout_seconds: int
    ) -> contextlib.AbstractAsyncContextManager[AsyncIterator[WatchEvent]]:
        """Events after `resource_version`, until the server ends the stream."""
        ...


class Api:
    """Typed requests over one `ApiClient`; close it when done."""

    def __init__(self, api_client: Any) -> None:
        self._client = api_client

    @property
    def host(self) -> str:
        """The apiserver URL this client talks to."""
        return str(self._client.configuration.host)

    async def close(self) -> None:
        """Close the connection pool."""
        await self._client.close()

    def _custom_objects(self) -> Any:
        return k8s.CustomObjectsApi(self._client)

    def _core(self) -> Any:
        return k8s.CoreV1Api(self._client)

    def _coordination(self) -> Any:
        return k8s.CoordinationV1Api(self._client)

    async def read_configmap(self, namespace: str, name: str) -> JSON:
        """One ConfigMap."""
        return await _json(
            self._core().read_namespaced_config_map(
                name, namespace, _preload_content=False, _request_timeout=REQUEST_TIMEOUT
            )
        )

    async def read_secret(self, namespace: str, name: str) -> JSON:
        """One Secret (SSH credentials a parent names)."""
        return await _json(
            self._core().read_namespaced_secret(
                name, namespace, _preload_content=False, _request_timeout=REQUEST_TIMEOUT
            )
        )

    async def read_lease(self, namespace: str, name: str) -> JSON:
        """One Lease (`ApiError` 404 when there is none)."""
        return await _json(
            self._coordination().read_namespaced_lease(
                name, namespace, _preload_content=False, _request_timeout=REQUEST_TIMEOUT
            )
        )

    async def create_lease(self, namespace: str, body: JSON) -> JSON:
        """Create a Lease (`ApiError` 409 AlreadyExists when it exists); the stored object."""
        return await _json(
            self._coordination().create_namespaced_lease(
                namespace, body, _preload_content=False, _request_timeout=REQUEST_TIMEOUT
            )
        )

    async def replace_lease(self, namespace: str, body: JSON) -> JSON:
        """Write a Lease whole; `metadata.resourceVersion` makes it conditional (409 Conflict)."""
        return await _json(
            self._coordination().replace_namespaced_lease(
                body["metadata"]["name"],
                namespace,
                body,
                _preload_content=False,
                _request_timeout=REQUEST_TIMEOUT,
            )
        )

    async def delete_lease(self, namespace: str, name: str, *, resource_version: str) -> None:
        """Delete a Lease only if it is still at `resource_version` (409 Conflict otherwise)."""
        options = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "preconditions": {"resourceVersion": resource_version},
        }
        await _json(
            self._coordination().delete_namespaced_lease(
                name,
                namespace,
                body=options,
                _preload_content=False,
                _request_timeout=REQUEST_TIMEOUT,
            )
        )

    async def create_token_review(self, body: JSON, *, request_timeout: float) -> JSON:
        """POST a TokenReview; the review with its status."""
        api: Any = k8s.AuthenticationV1Api(self._client)
        return await _json(
            api.create_token_review(body, _preload_content=False, _request_timeout=request_timeout)
        )

    async def create_event(self, namespace: str, body: JSON, *, request_timeout: float) -> JSON:
        """POST a core/v1 Event in `namespace`; the Event created."""
        return await _json(
            self._core().create_namespaced_event(
                namespace, body, _preload_content=False, _request_timeout=request_timeout
            )
        )

    async def create_subject_access_review(self, body: JSON, *, request_timeout: float) -> JSON:
        """POST a SubjectAccessReview; the review with its status."""
        api: Any = k8s.AuthorizationV1Api(self._client)
        return await _json(
            api.create_subject_access_review(
                body, _preload_content=False, _request_timeout=request_timeout
            )
        )


async def connect(kubeconfig: Path | None) -> Api:
    """A client from `kubeconfig`, or from the pod's ServiceAccount when None."""
    configuration = k8s.Configuration()
    try:
        if kubeconfig is not None:
            await k8sconfig.load_kube_config(
                config_file=str(kubeconfig), client_configuration=configuration
            )
        else:
            incluster: Any = k8sconfig.load_incluster_config  # untyped in the library
            incluster(client_configuration=configuration)
    except k8sconfig.ConfigException as exc:
        where = str(kubeconfig) if kubeconfig else "in-cluster configuration"
        raise ApiError(0, f"{where}: {exc}", reason="ConfigError") from None
    return Api(k8s.ApiClient(configuration=configuration))


class _Listing:
    """List and watch, the same for every kind: subclasses say which API call."""

    def _request(self, **params: Any) -> Any:
        raise NotImplementedError

    async def list(self, *, limit: int, continue_token: str) -> Page:
        """One page of the objects."""
        call = self._request(
            limit=limit,
            _continue=continue_token or None,
            _preload_content=False,
            _request_timeout=REQUEST_TIMEOUT,
        )
        return _page(await _json(call))

    @contextlib.asynccontextmanager
    async def watch(
        self, *, resource_version: str, timeout_seconds: int
    ) -> AsyncIterator[AsyncIterator[WatchEvent]]:
        """Changes after `resource_version`."""
        call = self._request(
            watch=True,
            allow_watch_bookmarks=True,
            resource_version=resource_version,
            timeout_seconds=timeout_seconds,
            _preload_content=False,
            _request_timeout=_watch_timeout(timeout_seconds),
        )
        async with _stream(call) as events:
            yield events


@dataclass(frozen=True)
class CustomObjects(_Listing):
    """Every object of one custom resource, cluster-wide."""

    api: Api
    group: str
    """The CRD's API group."""
    version: str
    """The version to read the objects in."""
    plural: str
    """The CRD's plural resource name."""

    def _request(self, **params: Any) -> Any:
        return self.api._custom_objects().list_cluster_custom_object(
            self.group, self.version, self.plural, **params
        )


@dataclass(frozen=True)
class ConfigMaps(_Listing):
    """The ConfigMaps of one namespace that a field selector picks."""

    api: Api
    namespace: str
    """The namespace."""
    field_selector: str
    """E.g. `metadata.name=extension-apiserver-authentication`."""

    def _request(self, **params: Any) -> Any:
        return self.api._core().list_namespaced_config_map(
            self.namespace, field_selector=self.field_selector, **params
        )


@dataclass(frozen=True)
class _Selected(_Listing):
    """The objects of one namespace that a label selector picks."""

    api: Api
    namespace: str
    """The namespace."""
    label_selector: str
    """E.g. `app.kubernetes.io/name=subres-agent`."""


class Leases(_Selected):
    """The Leases of one namespace that a label selector picks (the replicas' membership)."""

    def _request(self, **params: Any) -> Any:
        return self.api._coordination().list_namespaced_lease(
            self.namespace, label_selector=self.label_selector, **params
        )


class Pods(_Selected):
    """The pods of one namespace that a label selector picks (node agents, replicas)."""

    def _request(self, **params: Any) -> Any:
        return self.api._core().list_namespaced_pod(
            self.namespace, label_selector=self.label_selector, **params
        )


def _watch_timeout(timeout_seconds: int) -> aiohttp.ClientTimeout:
    # The server ends the stream after timeout_seconds; the margin catches a dead peer.
    return aiohttp.ClientTimeout(total=timeout_seconds + 30, connect=REQUEST_TIMEOUT)


async def _send(call: Any) -> aiohttp.ClientResponse:
    try:
        response: aiohttp.ClientResponse = await call
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise ApiError(0, str(exc) or type(exc).__name__, reason="ConnectionError") from None
    return response


async def _json(call: Any) -> JSON:
    response = await _send(call)
    async with response:
        try:
            body = await response.read()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise ApiError(0, str(exc) or type(exc).__name__, reason="ConnectionError") from None
    if not 200 <= response.status <= 299:
        raise _error(response.status, body)
    try:
        decoded = json.loads(body)
    except ValueError:
        raise ApiError(response.status, "response is not JSON", reason="BadResponse") from None
    if not isinstance(decoded, dict):
        raise ApiError(response.status, "response is not a JSON object", reason="BadResponse")
    return decoded


def _error(status: int, body: bytes) -> ApiError:
    """An `ApiError` from an error answer, using its Status object when there is one."""
    try:
        decoded = json.loads(body)
    except ValueError:
        decoded = None
    if isinstance(decoded, dict) and decoded.get("kind") == "Status":
        return status_error(decoded, default=status)
    return ApiError(status, body[:200].decode(errors="replace") or "no body")


def status_error(status: Mapping[str, Any], *, default: int) -> ApiError:
    """An `ApiError` from a Status object (an error answer or a watch ERROR event)."""
    code = status.get("code")
    return ApiError(
        code if isinstance(code, int) else default,
        str(status.get("message") or ""),
        reason=str(status.get("reason") or ""),
    )


def _page(body: JSON) -> Page:
    items = body.get("items")
    meta = body.get("metadata")
    if not isinstance(items, list) or not isinstance(meta, dict):
        raise ApiError(200, "list answer has no items or metadata", reason="BadResponse")
    return Page(
        items=[i for i in items if isinstance(i, dict)],
        resource_version=str(meta.get("resourceVersion") or ""),
        continue_token=str(meta.get("continue") or ""),
    )


@contextlib.asynccontextmanager
async def _stream(call: Any) -> AsyncIterator[AsyncIterator[WatchEvent]]:
    response = await _send(call)
    async with response:
        if not 200 <= response.status <= 299:
            raise _error(response.status, await response.read())
        yield _events(response)


async def _events(response: aiohttp.ClientResponse) -> AsyncIterator[WatchEvent]:
    # Lines are split here rather than with readline(): aiohttp caps a line at 128 KiB,
    # and one object may be larger.
    buffer = b""
    try:
        async for chunk in response.content.iter_any():
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            if len(buffer) > MAX_EVENT_BYTES:
                raise ApiError(0, "watch event too large", reason="BadResponse")
            for line in lines:
                if line.strip():
                    yield _event(line)
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise ApiError(0, str(exc) or type(exc).__name__, reason="ConnectionError") from None
    if buffer.strip():
        yield _event(buffer)


def _event(line: bytes) -> WatchEvent:
    try:
        decoded = json.loads(line)
    except ValueError:
        raise ApiError(0, "watch event is not JSON", reason="BadResponse") from None
    obj = decoded.get("object") if isinstance(decoded, dict) else None
    if not isinstance(obj, dict):
        raise ApiError(0, "watch event has no object", reason="BadResponse")
    return WatchEvent(type=str(decoded.get("type")), object=obj)
