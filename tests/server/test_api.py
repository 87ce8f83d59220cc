"""The API surface kube-apiserver and kubectl read: discovery, OpenAPI, health, metrics."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from subres.server.discovery import AGGREGATED_TYPES
from tests.support import GROUP_VERSION, Standalone, machine, start_standalone

GROUP = "subresources.subres.dev"
V2 = AGGREGATED_TYPES["v2"]


@pytest.fixture
async def http(tmp_path: Path) -> AsyncIterator[tuple[Standalone, aiohttp.ClientSession]]:
    async with (
        start_standalone(tmp_path, machine("vm1")) as subres,
        aiohttp.ClientSession(
            base_url=subres.base,
            headers=subres.auth,
            connector=aiohttp.TCPConnector(ssl=subres.client_ssl),
        ) as session,
    ):
        yield subres, session


Client = tuple[Standalone, aiohttp.ClientSession]


async def test_api_group_list_and_group(http: Client) -> None:
    _, s = http
    async with s.get("/apis") as r:
        body = await r.json()
    assert body["kind"] == "APIGroupList"
    assert body["groups"][0]["name"] == GROUP
    assert body["groups"][0]["preferredVersion"]["groupVersion"] == GROUP_VERSION
    async with s.get(f"/apis/{GROUP}") as r:
        body = await r.json()
    assert (body["kind"], body["name"]) == ("APIGroup", GROUP)


async def test_resource_list_names_every_subresource(http: Client) -> None:
    _, s = http
    async with s.get(f"/apis/{GROUP_VERSION}") as r:
        assert r.status == 200
        body = await r.json()
    assert body["kind"] == "APIResourceList" and body["groupVersion"] == GROUP_VERSION
    verbs = {res["name"]: res["verbs"] for res in body["resources"]}
    assert verbs == {
        "machines/console": ["create", "get"],
        "machines/console-observe": ["create", "get"],
        "machines/vnc": ["get"],
        "machines/vnc-observe": ["get"],
        "machines/screenshot": ["get"],
        "machines/portforward": ["create", "get"],
        "machines/usbredir": ["get"],
        "machines/sessions": ["get"],
        "machines/log": ["get"],
        "machines/recordings": ["get"],
        "sessions": ["list"],
    }
    kinds = {res["name"]: res["kind"] for res in body["resources"]}
    assert (kinds["machines/sessions"], kinds["sessions"]) == ("SessionList", "Session")
    assert all(res["namespaced"] for res in body["resources"])


async def test_aggregated_discovery_etag_and_304(http: Client) -> None:
    _, s = http
    accept = f"{V2},application/json"
    async with s.get("/apis", headers={"Accept": accept}) as r:
        raw = await r.read()
        assert r.headers["Content-Type"] == V2
        assert r.headers["Vary"] == "Accept"
        etag = r.headers["ETag"]
    assert etag == f'"{hashlib.sha512(raw).hexdigest()}"'
    doc = json.loads(raw)
    assert doc["apiVersion"] == "apidiscovery.k8s.io/v2"
    (group,) = doc["items"]
    assert group["metadata"]["name"] == GROUP
    (version,) = group["versions"]
    resource, sessions = version["resources"]
    assert (sessions["resource"], sessions["verbs"]) == ("sessions", ["list"])
    assert resource["resource"] == "machines" and resource["scope"] == "Namespaced"
    assert resource["singularResource"] == "machine" and "verbs" in resource
    assert {sub["subresource"] for sub in resource["subresources"]} == {
        "console",
        "console-observe",
        "vnc",
        "vnc-observe",
        "screenshot",
        "portforward",
        "usbredir",
        "log",
        "recordings",
        "sessions",
    }
    async with s.get("/apis", headers={"Accept": accept, "If-None-Match": etag}) as r:
        assert r.status == 304
        assert await r.read() == b""


async def test_openapi_v2_etag(http: Client) -> None:
    _, s = http
    async with s.get("/openapi/v2") as r:
        spec = await r.json()
        etag = r.headers["ETag"]
    path = f"/apis/{GROUP_VERSION}/namespaces/{{namespace}}/machines/{{name}}/console"
    assert set(spec["paths"][path]) == {"get", "post", "parameters"}
    observe = spec["paths"][path + "-observe"]
    assert observe["get"]["operationId"] == "connectGetNamespacedMachineConsoleObserve"
    async with s.get("/openapi/v2", headers={"If-None-Match": etag}) as r:
        assert r.status == 304


async def test_openapi_v3_immutable_under_its_hash_and_never_a_redirect(http: Client) -> None:
    _, s = http
    async with s.get("/openapi/v3") as r:
        index = await r.json()
    url = index["paths"][f"apis/{GROUP_VERSION}"]["serverRelativeURL"]
    async with s.get(url) as r:
        assert r.status == 200
        assert r.headers["Cache-Control"] == "public, immutable"
        assert (await r.json())["openapi"].startswith("3.")
    # kube-apiserver would turn a redirect into a 502: the same document, not cacheable.
    stale = f"/openapi/v3/apis/{GROUP_VERSION}?hash=OLD"
    async with s.get(stale, allow_redirects=False) as r:
        assert r.status == 200 and "Location" not in r.headers
        assert r.headers["Cache-Control"] == "no-cache, private"
        assert (await r.json())["openapi"].startswith("3.")


async def test_health_for_anonymous_callers(http: Client) -> None:
    subres, _ = http
    async with aiohttp.ClientSession(base_url=subres.base) as anon:
        for path in ("/healthz", "/livez", "/readyz"):
            async with anon.get(path, ssl=subres.client_ssl) as r:
                assert (r.status, await r.text()) == (200, "ok")
        async with anon.get("/readyz?verbose", ssl=subres.client_ssl) as r:
            text = await r.text()
        assert "[+]parent-caches ok" in text and text.endswith("readyz check passed\n")
        async with anon.get(f"/apis/{GROUP_VERSION}", ssl=subres.client_ssl) as r:
            assert r.status == 401


async def test_readyz_fails_until_parents_are_loaded(http: Client) -> None:
    subres, s = http
    cache = subres.server.state.caches["machines"]
    cache.synced = False
    async with s.get("/readyz") as r:
        assert r.status == 500
        assert "[-]parent-caches failed" in await r.text()
    async with s.get("/livez") as r:
        assert r.status == 200


async def test_metrics_count_sessions(http: Client) -> None:
    _, s = http
    async with s.get("/metrics") as r:
        text = await r.text()
    assert r.status == 200
    assert "subres_sessions_active" in text and "subres_backend_dial_seconds" in text
