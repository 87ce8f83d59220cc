"""A small fake kube-apiserver on 127.0.0.1 over HTTPS, for cluster-mode tests.

Answers list and watch of Machines, the authentication ConfigMap, TokenReview,
SubjectAccessReview, Event creation and Secret reads with the real JSON shapes, and Leases
as kube-apiserver keeps them (create, conditional replace and delete, list
and watch by label), and counts every call. Tests steer it: add, change and
delete objects, expire resource versions (410 Gone), send bookmarks, fail
calls, hold TokenReviews at a gate.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from subres.serving import certs

__all__ = ["FakeApiServer", "start_fake"]

MACHINES = "/apis/subres.dev/v1alpha1/machines"
CONFIGMAPS = "/api/v1/namespaces/kube-system/configmaps"
CONFIGMAP = f"{CONFIGMAPS}/extension-apiserver-authentication"
TOKENREVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
SARS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
EVENTS = "/api/v1/namespaces/{namespace}/events"
PODS = "/api/v1/namespaces/{namespace}/pods"
SECRET = "/api/v1/namespaces/{namespace}/secrets/{name}"

Json = dict[str, Any]


def _status(code: int, message: str, reason: str) -> web.Response:
    body: Json = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message}
    body |= {"reason": reason, "code": code}
    return web.json_response(body, status=code)


@dataclass
class Collection:
    """Objects with a resourceVersion history that watches replay."""

    objects: dict[tuple[str, str], Json] = field(default_factory=dict)
    history: list[tuple[int, str, Json]] = field(default_factory=list)
    gone_below: int = 0


@dataclass
class FakeApiServer:
    """State and counters; see the module docstring."""

    dir: Path
    calls: collections.Counter[str] = field(default_factory=collections.Counter)
    rv: int = 100
    machines: Collection = field(default_factory=Collection)
    configmaps: Collection = field(default_factory=Collection)
    leases: Collection = field(default_factory=Collection)
    pods: Collection = field(default_factory=Collection)
    secrets: dict[tuple[str, str], Json] = field(default_factory=dict)
    """Secrets by namespace and name (SSH credentials), read one GET at a time."""
    lease_error: int = 0
    """When set, Lease writes answer this status."""
    configmap_error: int = 0
    fail_lists: int = 0
    watch_versions: list[str] = field(default_factory=list)
    open_watches: int = 0
    tokens: dict[str, Json] = field(default_factory=dict)
    token_error: bool = False
    token_gate: asyncio.Event | None = None
    allow: Callable[[Json], bool] = lambda spec: False
    sar_error: bool = False
    sar_specs: list[Json] = field(default_factory=list)
    events: list[Json] = field(default_factory=list)
    """Events created, in order, with the namespace of their URL in `metadata`."""
    event_error: int = 0
    """Answer Event creations with this status instead."""
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    port: int = 0
    ca: Path = Path()
    _runner: web.AppRunner | None = None

    # --- steering -------------------------------------------------------------------------

    def lease(self, namespace: str, name: str) -> Json | None:
        """The stored Lease, or None."""
        return self.leases.objects.get((namespace, name))

    async def put_pod(self, obj: Json) -> None:
        """Add or change a Pod."""
        key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        kind = "MODIFIED" if key in self.pods.objects else "ADDED"
        await self._record(self.pods, kind, obj, key)

    async def put_lease(self, obj: Json) -> None:
        """Add or change a Lease, as another replica would write it."""
        key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
        kind = "MODIFIED" if key in self.leases.objects else "ADDED"
        await self._record(self.leases, kind, obj, key)

    async def remove_lease(self, namespace: str, name: str) -> None:
        """Delete a Lease (DELETED), as a replica leaving would."""
        obj = self.leases.objects[(namespace, name)]
        await self._record(self.leases, "DELETED", obj, (namespace, name))

    async def put(self, obj: Json, *, configmap: bool = False) -> None:
        """Add or change an object (ADDED or MODIFIED)."""
        coll = self.configmaps if configmap else self.machines
        key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        kind = "MODIFIED" if key in coll.objects else "ADDED"
        await self._record(coll, kind, obj, key)

    async def remove(self, namespace: str, name: str) -> None:
        """Delete a machine (DELETED)."""
        obj = self.machines.objects[(namespace, name)]
        await self._record(self.machines, "DELETED", obj, (namespace, name))

    async def expire(self) -> None:
        """Forget history: every version up to now answers 410 Gone; open watches end."""
        self.machines.gone_below = self.rv + 1
        self.machines.history.clear()
        await self._bump("expire")

    async def bookmark(self, version: int) -> None:
        """Send a BOOKMARK at `version` to open machine watches."""
        self.rv = max(self.rv, version)
        meta = {"resourceVersion": str(version)}
        self.machines.history.append((version, "BOOKMARK", {"kind": "Machine", "metadata": meta}))
        await self._bump("bookmark")

    async def end_watches(self) -> None:
        """Make open watches end as a server timeout would."""
        await self._bump("end")

    async def wait(self, predicate: Callable[[], bool]) -> None:
        """Wait (at most 5 s) until `predicate` holds."""
        async with asyncio.timeout(5), self.changed:
            await self.changed.wait_for(predicate)

    async def _record(self, coll: Collection, kind: str, obj: Json, key: tuple[str, str]) -> None:
        self.rv += 1
        obj = json.loads(json.dumps(obj))
        obj["metadata"]["resourceVersion"] = str(self.rv)
        if kind == "DELETED":
            coll.objects.pop(key)
        else:
            coll.objects[key] = obj
        coll.history.append((self.rv, kind, obj))
        await self._bump("record")

    async def _bump(self, what: str) -> None:
        async with self.changed:
            self.calls[f"event:{what}"] += 1
            self.changed.notify_all()

    async def _count(self, what: str) -> None:
        async with self.changed:
            self.calls[what] += 1
            self.changed.notify_all()

    # --- kubeconfig -------------------------------------------------------------------------

    def kubeconfig(self, token: str = "subres-sa-token") -> Path:
        """A kubeconfig for this server."""
        path = self.dir / f"kubeconfig-{token}"
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "fake",
                    "cluster": {
                        "server": f"https://127.0.0.1:{self.port}",
                        "certificate-authority": str(self.ca),
                    },
                }
            ],
            "users": [{"name": "sa", "user": {"token": token}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "sa"}}],
            "current-context": "fake",
        }
        path.write_text(yaml.safe_dump(doc))
        return path

    # --- handlers ---------------------------------------------------------------------------

    def app(self) -> web.Application:
        """The aiohttp application."""
        app = web.Application()
        app.router.add_get(MACHINES, functools.partial(self._collection, coll=self.machines))
        app.router.add_get(CONFIGMAPS, functools.partial(self._collection, coll=self.configmaps))
        app.router.add_get(CONFIGMAP, self._configmap)
        app.router.add_post(TOKENREVIEWS, self._tokenreview)
        app.router.add_post(SARS, self._sar)
        app.router.add_get(LEASES, functools.partial(self._collection, coll=self.leases))
        app.router.add_post(LEASES, self._create_lease)
        app.router.add_get(LEASES + "/{name}", self._read_lease)
        app.router.add_put(LEASES + "/{name}", self._replace_lease)
        app.router.add_delete(LEASES + "/{name}", self._delete_lease)
        app.router.add_post(EVENTS, self._event)
        app.router.add_get(PODS, functools.partial(self._collection, coll=self.pods))
        app.router.add_get(SECRET, self._secret)
        return app

    async def _collection(self, request: web.Request, *, coll: Collection) -> Any:
        names = {id(self.machines): "machines", id(self.leases): "leases", id(self.pods): "pods"}
        name = names.get(id(coll), "cm")
        if request.query.get("watch") in ("true", "1", "True"):
            return await self._watch(request, coll, name)
        await self._count(f"list:{name}")
        if name == "cm" and self.configmap_error:
            return _status(self.configmap_error, "nope", "Forbidden")
        if self.fail_lists:
            self.fail_lists -= 1
            return _status(500, "etcd is sad", "InternalError")
        selector = request.query.get("fieldSelector", "")
        items = [
            o
            for o in coll.objects.values()
            if (not selector or selector == f"metadata.name={o['metadata']['name']}")
            and _selected(request, o)
        ]
        return web.json_response(
            {"kind": "List", "apiVersion": "v1", "metadata": {"resourceVersion": str(self.rv)}}
            | {"items": items}
        )

    async def _watch(self, request: web.Request, coll: Collection, name: str) -> Any:
        await self._count(f"watch:{name}")
        version = int(request.query.get("resourceVersion") or 0)
        if name == "machines":
            self.watch_versions.append(request.query.get("resourceVersion", ""))
        assert request.query.get("allowWatchBookmarks") in ("true", "True")
        response = web.StreamResponse()
        response.content_type = "application/json"
        await response.prepare(request)
        if version < coll.gone_below:
            gone = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}
            await response.write(json.dumps({"type": "ERROR", "object": gone}).encode() + b"\n")
            return response
        self.open_watches += 1
        try:
            await self._stream(request, response, coll, version)
        finally:
            self.open_watches -= 1
            await self._bump("watch-closed")
        return response

    async def _stream(
        self, request: web.Request, response: web.StreamResponse, coll: Collection, version: int
    ) -> None:
        seconds = int(request.query["timeoutSeconds"])
        sent = version
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                while True:
                    async with self.changed:
                        marker = sum(self.calls[k] for k in ("event:expire", "event:end"))
                        pending = [e for e in coll.history if e[0] > sent]
                        if not pending:
                            await self.changed.wait()
                            now = sum(self.calls[k] for k in ("event:expire", "event:end"))
                            if now != marker:
                                return
                            continue
                    for rv, kind, obj in pending:
                        if not _selected(request, obj):
                            sent = rv
                            continue
                        line = json.dumps({"type": kind, "object": obj}).encode() + b"\n"
                        await response.write(line)
                        sent = rv

    async def _create_lease(self, request: web.Request) -> web.Response:
        obj = await request.json()
        await self._count("lease:create")
        key = (request.match_info["namespace"], obj["metadata"]["name"])
        if self.lease_error:
            return _status(self.lease_error, "leases is forbidden", "Forbidden")
        if key in self.leases.objects:
            return _status(409, f'leases "{key[1]}" already exists', "AlreadyExists")
        obj["metadata"]["namespace"] = key[0]
        await self._record(self.leases, "ADDED", obj, key)
        return web.json_response(self.leases.objects[key], status=201)

    async def _read_lease(self, request: web.Request) -> web.Response:
        await self._count("lease:read")
        current = self.lease(request.match_info["namespace"], request.match_info["name"])
        if current is None:
            return _status(404, "not found", "NotFound")
        return web.json_response(current)

    async def _replace_lease(self, request: web.Request) -> web.Response:
        obj = await request.json()
        await self._count("lease:replace")
        key = (request.match_info["namespace"], request.match_info["name"])
        if self.lease_error:
            return _status(self.lease_error, "leases is forbidden", "Forbidden")
        current = self.leases.objects.get(key)
        if current is None:
            return _status(404, "not found", "NotFound")
        wanted = obj["metadata"].get("resourceVersion")
        if wanted and wanted != current["metadata"]["resourceVersion"]:
            return _status(409, "the object has been modified", "Conflict")
        await self._record(self.leases, "MODIFIED", obj, key)
        return web.json_response(self.leases.objects[key])

    async def _delete_lease(self, request: web.Request) -> web.Response:
        options = await request.json() if request.can_read_body else {}
        await self._count("lease:delete")
        key = (request.match_info["namespace"], request.match_info["name"])
        current = self.leases.objects.get(key)
        if current is None:
            return _status(404, "not found", "NotFound")
        wanted = (options.get("preconditions") or {}).get("resourceVersion")
        if wanted and wanted != current["metadata"]["resourceVersion"]:
            return _status(409, "precondition failed", "Conflict")
        await self._record(self.leases, "DELETED", current, key)
        return web.json_response({"kind": "Status", "status": "Success"})

    async def _configmap(self, request: web.Request) -> web.Response:
        await self._count("get:cm")
        if self.configmap_error:
            return _status(self.configmap_error, "configmaps is forbidden", "Forbidden")
        obj = self.configmaps.objects.get(("kube-system", "extension-apiserver-authentication"))
        if obj is None:
            return _status(404, "not found", "NotFound")
        return web.json_response(obj)

    async def _secret(self, request: web.Request) -> web.Response:
        await self._count("get:secret")
        obj = self.secrets.get((request.match_info["namespace"], request.match_info["name"]))
        if obj is None:
            return _status(404, "not found", "NotFound")
        return web.json_response(obj)

    async def _tokenreview(self, request: web.Request) -> web.Response:
        review = await request.json()
        await self._count("tokenreview")
        if self.token_gate is not None:
            async with asyncio.timeout(5):
                await self.token_gate.wait()
        if self.token_error:
            return _status(500, "authentication webhook down", "InternalError")
        user = self.tokens.get(review["spec"]["token"])
        status: Json = {"authenticated": True, "user": user} if user else {"error": "bad token"}
        return web.json_response(review | {"status": status}, status=201)

    async def _sar(self, request: web.Request) -> web.Response:
        review = await request.json()
        self.sar_specs.append(review["spec"])
        await self._count("sar")
        if self.sar_error:
            return _status(500, "authorizer down", "InternalError")
        allowed = self.allow(review["spec"])
        status = {"allowed": allowed} | ({} if allowed else {"reason": "no RBAC policy matched"})
        return web.json_response(review | {"status": status}, status=201)

    async def _event(self, request: web.Request) -> web.Response:
        event = await request.json()
        await self._count("event")
        if self.event_error:
            return _status(self.event_error, "events is forbidden", "Forbidden")
        event["metadata"]["namespace"] = request.match_info["namespace"]
        async with self.changed:
            self.events.append(event)
            self.changed.notify_all()
        return web.json_response(event, status=201)


def _selected(request: web.Request, obj: Json) -> bool:
    """Whether `obj` matches the request's equality-based label selector."""
    labels = obj.get("metadata", {}).get("labels") or {}
    wanted = [p.split("=", 1) for p in request.query.get("labelSelector", "").split(",") if p]
    return all(labels.get(k) == v for k, v in wanted)


@contextlib.asynccontextmanager
async def start_fake(tmp: Path) -> AsyncIterator[FakeApiServer]:
    """Run a fake apiserver on 127.0.0.1 with its own CA; stop it afterwards."""
    import ssl

    ca = certs.generate_ca("fake-apiserver-ca")
    serving = certs.issue_serving(
        ca, common_name="fake", dns_names=["localhost"], ip_addresses=["127.0.0.1"]
    )
    ca.write(tmp / "fake-ca.crt", tmp / "fake-ca.key")
    serving.write(tmp / "fake.crt", tmp / "fake.key")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp / "fake.crt", tmp / "fake.key")
    fake = FakeApiServer(dir=tmp, ca=tmp / "fake-ca.crt")
    runner = web.AppRunner(fake.app(), shutdown_timeout=1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    fake.port = int(runner.addresses[0][1])
    try:
        yield fake
    finally:
        await fake.end_watches()
        await runner.cleanup()
