"""Cluster mode end to end against a fake apiserver: front proxy, client CA, tokens, SAR.

The server is the real one from `complete_cluster`; it reads the authentication
ConfigMap, watches Machines, and asks TokenReview/SubjectAccessReview of the fake.
"""

from __future__ import annotations

import contextlib
import json
import ssl
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from subres.auth.authconfig import ConfigLookupError
from subres.kube.informer import InformerSettings
from subres.server.options import Options
from subres.server.run import Server, complete_cluster
from subres.serving import certs
from tests.fakeapi import FakeApiServer, start_fake
from tests.support import GROUP_VERSION, LOOPBACK_POLICY, Backend, machine, wait_for

PROXY_CA = certs.generate_ca("front-proxy-ca")
CLIENT_CA = certs.generate_ca("client-ca")
FAST = InformerSettings(backoff_initial=0.01, backoff_max=0.05)


def configmap() -> dict[str, Any]:
    data = {
        "client-ca-file": CLIENT_CA.cert_pem().decode(),
        "requestheader-client-ca-file": PROXY_CA.cert_pem().decode(),
        "requestheader-allowed-names": json.dumps(["front-proxy-client"]),
        "requestheader-username-headers": json.dumps(["X-Remote-User"]),
        "requestheader-group-headers": json.dumps(["X-Remote-Group"]),
        "requestheader-extra-headers-prefix": json.dumps(["X-Remote-Extra-"]),
    }
    meta = {"name": "extension-apiserver-authentication", "namespace": "kube-system"}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}


def options(tmp: Path, fake: FakeApiServer, **changes: Any) -> Options:
    config = {"endpointPolicy": LOOPBACK_POLICY}
    (tmp / "config.yaml").write_text(yaml.safe_dump(config))
    base = Options(
        secure_port=0,
        bind_address="127.0.0.1",
        cert_dir=tmp / "certs",
        tls_cert_file=None,
        tls_private_key_file=None,
        client_ca_file=None,
        config=tmp / "config.yaml",
        standalone=None,
        token_auth_file=None,
        service_name="subres",
        service_namespace="subres-system",
        authorization_always_allow_paths=("/healthz", "/readyz", "/livez"),
        shutdown_grace=1.0,
        kubeconfig=fake.kubeconfig(),
        session_audit_log=str(tmp / "audit.jsonl"),
    )
    return replace(base, **changes)


@contextlib.asynccontextmanager
async def cluster(tmp: Path, **changes: Any) -> AsyncIterator[tuple[FakeApiServer, Server]]:
    async with start_fake(tmp) as fake:
        await fake.put(configmap(), configmap=True)
        fake.tokens["alice-token"] = {"username": "alice", "groups": ["devs"]}
        server = await complete_cluster(options(tmp, fake, **changes), informers=FAST)
        await server.start()
        try:
            yield fake, server
        finally:
            await server.stop()


def client_ssl(tmp: Path, pair: certs.KeyPair | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(tmp / "certs" / "ca.crt"))
    if pair is not None:
        pair.write(tmp / "client.crt", tmp / "client.key")
        ctx.load_cert_chain(tmp / "client.crt", tmp / "client.key")
    return ctx


async def get(
    server: Server, path: str, ctx: ssl.SSLContext, **headers: str
) -> tuple[int, dict[str, Any]]:
    url = f"https://127.0.0.1:{server.port}{path}"
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            url, ssl=ctx, headers={k.replace("_", "-"): v for k, v in headers.items()}
        ) as r,
    ):
        text = await r.text()
        return r.status, json.loads(text) if text.startswith("{") else {"text": text}


CONSOLE = f"/apis/{GROUP_VERSION}/namespaces/default/machines/vm/console"


async def test_ready_only_after_caches_synced_and_config_loaded(tmp_path: Path) -> None:
    async with start_fake(tmp_path) as fake:
        await fake.put(configmap(), configmap=True)
        fake.fail_lists = 10_000
        server = await complete_cluster(options(tmp_path, fake), informers=FAST)
        await server.start()
        try:
            status, body = await get(server, "/readyz?verbose", client_ssl(tmp_path))
            assert status == 500 and "[-]parent-caches" in body["text"]
            assert "[+]authentication-config ok" in body["text"]
            fake.fail_lists = 0
            state = server.state
            # Every informer (parents, replica Leases and Pods) relists after its own backoff.
            await wait_for(
                lambda: (
                    all(c.synced for c in state.caches.values())
                    and all(check() for check in state.readiness.values())
                )
            )
            assert (await get(server, "/readyz", client_ssl(tmp_path)))[0] == 200
        finally:
            await server.stop()


async def test_front_proxy_identity_reaches_the_sar(tmp_path: Path) -> None:
    async with cluster(tmp_path) as (fake, server):
        fake.allow = lambda spec: True
        proxy = certs.issue_client(PROXY_CA, user="front-proxy-client", groups=[])
        status, _ = await get(
            server,
            f"/apis/{GROUP_VERSION}",
            client_ssl(tmp_path, proxy),
            X_Remote_User="alice",
            X_Remote_Extra_Scope="s1",
        )
        assert status == 200
        spec = fake.sar_specs[-1]
        assert spec["user"] == "alice"
        assert spec["groups"] == ["system:authenticated"]
        assert spec["extra"] == {"scope": ["s1"]}


async def test_forged_headers_without_a_proxy_certificate(tmp_path: Path) -> None:
    backend = await Backend().start_tcp()
    try:
        async with cluster(tmp_path) as (fake, server):
            await fake.put(machine("vm", console=backend.url))
            await wait_for(lambda: server.state.caches["machines"].get("default", "vm") is not None)
            fake.allow = lambda spec: spec["user"] != "system:anonymous"
            ctx = client_ssl(tmp_path)
            status, body = await get(server, CONSOLE, ctx, X_Remote_User="admin")
            assert status == 401 and body["reason"] == "Unauthorized"
            assert fake.sar_specs[-1]["user"] == "system:anonymous"
            intruder = certs.issue_client(PROXY_CA, user="intruder", groups=[])
            status, _ = await get(
                server, CONSOLE, client_ssl(tmp_path, intruder), X_Remote_User="admin"
            )
            assert status == 401
            assert backend.accepted == 0
    finally:
        await backend.stop()


async def test_client_ca_certificate_is_its_own_identity(tmp_path: Path) -> None:
    async with cluster(tmp_path) as (fake, server):
        fake.allow = lambda spec: True
        carol = certs.issue_client(CLIENT_CA, user="carol", groups=["ops"])
        path = f"/apis/{GROUP_VERSION}"
        status, _ = await get(server, path, client_ssl(tmp_path, carol), X_Remote_User="admin")
        assert status == 200
        assert fake.sar_specs[-1]["user"] == "carol"
        assert fake.sar_specs[-1]["groups"] == ["ops", "system:authenticated"]


async def test_token_denied_is_403_naming_everything(tmp_path: Path) -> None:
    async with cluster(tmp_path) as (fake, server):
        ctx = client_ssl(tmp_path)
        status, body = await get(server, CONSOLE, ctx, Authorization="Bearer alice-token")
        assert status == 403
        assert body["message"] == (
            'machines.subresources.subres.dev "vm" is forbidden: User "alice" cannot get '
            'resource "machines/console" in API group "subresources.subres.dev" in the '
            'namespace "default"'
        )
        status, _ = await get(server, CONSOLE, ctx, Authorization="Bearer wrong")
        assert status == 401
        fake.sar_error = True  # the console denial stays cached; vnc is a new question
        vnc = CONSOLE.replace("console", "vnc")
        status, body = await get(server, vnc, ctx, Authorization="Bearer alice-token")
        assert status == 500 and body["reason"] == "InternalError"


async def test_configmap_forbidden_is_fatal_unless_tolerated(tmp_path: Path) -> None:
    async with start_fake(tmp_path) as fake:
        fake.configmap_error = 403
        with pytest.raises(ConfigLookupError, match="extension-apiserver-authentication-reader"):
            await complete_cluster(options(tmp_path, fake), informers=FAST)
        tolerant = options(tmp_path, fake, authentication_tolerate_lookup_failure=True)
        server = await complete_cluster(tolerant, informers=FAST)
        await server.start()
        try:
            assert server.state.readiness["authentication-config"]()
        finally:
            await server.stop()
