"""`/metrics` scraped and parsed: requests by kind and code, the process, the auth caches."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from subres.server.run import Server
from subres.serving import certs
from subres.serving.metrics import request_kind
from tests.server.test_cluster import CLIENT_CA, client_ssl, cluster
from tests.support import GROUP_VERSION, Backend, Standalone, machine, start_standalone

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(base: str, ctx: ssl.SSLContext, headers: dict[str, str]) -> Samples:
    """Every sample of `/metrics`, by name and sorted labels."""
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{base}/metrics", ssl=ctx, headers=headers) as response,
    ):
        assert response.status == 200
        text = await response.text()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def requests(samples: Samples, kind: str, code: int) -> float:
    return samples.get(("subres_requests_total", (("code", str(code)), ("kind", kind))), 0)


@pytest.fixture
async def subres(tmp_path: Path) -> AsyncIterator[tuple[Standalone, Backend]]:
    backend = await Backend().start_tcp()
    try:
        async with start_standalone(tmp_path, machine("vm", console=backend.url)) as s:
            yield s, backend
    finally:
        await backend.stop()


async def _get(s: Standalone, path: str, headers: dict[str, str]) -> int:
    async with (
        aiohttp.ClientSession() as http,
        http.get(s.base + path, ssl=s.client_ssl, headers=headers) as response,
    ):
        return response.status


async def test_every_answer_is_counted_by_kind_and_code(
    subres: tuple[Standalone, Backend],
) -> None:
    s, _ = subres
    before = await scrape(s.base, s.client_ssl, s.auth)
    assert await _get(s, f"/apis/{GROUP_VERSION}", s.auth) == 200
    assert (
        await _get(s, "/apis/" + GROUP_VERSION + "/namespaces/default/machines/x/vnc", s.auth)
        == 404
    )
    assert await _get(s, f"/apis/{GROUP_VERSION}", {"Authorization": "Bearer wrong"}) == 401
    assert await _get(s, "/no/such/path", s.auth) == 404
    async with s.websocket(s.url("vm")) as ws:
        await ws.send(b"ping")
    after = await scrape(s.base, s.client_ssl, s.auth)

    def grew(kind: str, code: int) -> float:
        return requests(after, kind, code) - requests(before, kind, code)

    assert grew("discovery", 200) == 1
    assert grew("discovery", 401) == 1
    assert grew("vnc", 404) == 1
    assert grew("other", 404) == 1
    assert grew("console", 101) == 1
    # The first scrape was answered before the second one was generated.
    assert grew("metrics", 200) == 1


async def test_the_process_collector(subres: tuple[Standalone, Backend]) -> None:
    s, _ = subres
    samples = await scrape(s.base, s.client_ssl, s.auth)
    assert samples[("process_resident_memory_bytes", ())] > 1 << 20
    assert samples[("process_open_fds", ())] >= 3


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        (f"/apis/{GROUP_VERSION}/namespaces/n/machines/m/console", "console"),
        (f"/apis/{GROUP_VERSION}/namespaces/n/machines/m/portforward/22/tcp", "portforward"),
        (f"/apis/{GROUP_VERSION}/namespaces/n/machines/m/made-up-{'x' * 40}", "other"),
        ("/apis", "discovery"),
        ("/openapi/v3", "openapi"),
        ("/readyz/ping", "health"),
        ("/ui/app.js", "ui"),
        ("/", "other"),
    ],
)
def test_kinds_are_a_fixed_set(path: str, kind: str) -> None:
    assert request_kind(path) == kind


CONSOLE = f"/apis/{GROUP_VERSION}/namespaces/default/machines/vm/console"


async def test_auth_cache_hits_and_misses(tmp_path: Path) -> None:
    async with cluster(tmp_path) as (fake, server):
        fake.allow = lambda spec: True
        token = {"Authorization": "Bearer alice-token"}
        for _ in range(3):
            await _cluster_get(server, f"/apis/{GROUP_VERSION}", tmp_path, token)
        carol = certs.issue_client(CLIENT_CA, user="carol", groups=["ops"])
        samples = await scrape(f"https://127.0.0.1:{server.port}", client_ssl(tmp_path, carol), {})

    def cache(name: str, result: str) -> float:
        key = ("subres_auth_cache_requests_total", (("cache", name), ("result", result)))
        return samples[key]

    # Three requests with one token: one review, two answers from the cache.
    assert (cache("tokenreview", "miss"), cache("tokenreview", "hit")) == (1, 2)
    # alice's question was asked once; carol's scrape is a new question.
    assert (cache("subjectaccessreview", "miss"), cache("subjectaccessreview", "hit")) == (2, 2)
    assert len(fake.sar_specs) == 2


async def _cluster_get(server: Server, path: str, tmp: Path, headers: dict[str, str]) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.get(
            f"https://127.0.0.1:{server.port}{path}", ssl=client_ssl(tmp), headers=headers
        ) as response,
    ):
        assert response.status == 200


async def test_a_dry_run_counts_as_a_success_and_dials_nothing(tmp_path: Path) -> None:
    """`subres port-forward` and `subres vnc` check before they listen: a check that passes
    is a 200, not the 400 each successful start used to count."""
    backend = await Backend().start_tcp()
    port = int(backend.url.rsplit(":", 1)[1])
    vm = machine("vm", status={"portForward": {"address": "127.0.0.1", "ports": [port]}})
    vm["status"]["vnc"] = {"endpoint": backend.url}
    stopped = machine("off", phase="Stopped", status={"vnc": {"endpoint": backend.url}})
    try:
        async with start_standalone(tmp_path, vm, stopped) as s:
            before = await scrape(s.base, s.client_ssl, s.auth)
            machines = f"/apis/{GROUP_VERSION}/namespaces/default/machines"
            forward = f"{machines}/vm/portforward?ports={port}&dryRun=All"
            assert await _get(s, forward, s.auth) == 200
            assert await _get(s, f"{machines}/vm/vnc?dryRun=All", s.auth) == 200
            # The dry run checks what the real thing would: a port not allowed, a stopped one.
            assert await _get(s, forward.replace(f"={port}", "=1"), s.auth) == 403
            assert await _get(s, f"{machines}/off/vnc?dryRun=All", s.auth) == 409
            assert await _get(s, f"{machines}/vm/vnc?dryRun=None", s.auth) == 400
            upgrade = {**s.auth, "Connection": "Upgrade", "Upgrade": "websocket"}
            assert await _get(s, f"{machines}/vm/vnc?dryRun=All", upgrade) == 400
            after = await scrape(s.base, s.client_ssl, s.auth)
    finally:
        await backend.stop()
    assert backend.accepted == 0

    def grew(kind: str, code: int) -> float:
        return requests(after, kind, code) - requests(before, kind, code)

    assert (grew("portforward", 200), grew("vnc", 200)) == (1, 1)
    assert grew("portforward", 400) == 0
