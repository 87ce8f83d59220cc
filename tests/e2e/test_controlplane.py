"""The real control plane the e2e suite stands on: kubectl, RBAC, restarts, aggregation.

The aggregation test registers a stand-in aggregated server (a few lines of
aiohttp, not subres) through a real APIService, proving the route the real
server will take: ExternalName Service, caBundle, front-proxy client
certificate, X-Remote-* headers.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from subres.server import certs
from tests import gotools
from tests.e2e.aggregation import (
    grant_delegated_auth,
    register_apiservice,
    wait_apiservice_available,
)
from tests.e2e.controlplane import APIError, ControlPlane, poll
from tests.e2e.credentials import ADMIN_USER, FRONT_PROXY_CLIENT

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "deploy" / "crd-machine.yaml"

GROUP = "subresources.subres.dev"
VERSION = "v1alpha1"
STANDIN_NAMESPACE = "subres-standin"
STANDIN_SERVICE = "subres"


async def ensure_machine_crd(plane: ControlPlane) -> None:
    """Apply the Machine CRD with real kubectl and wait until it is Established."""
    (await plane.kubectl("apply", "-f", str(CRD))).check()
    (
        await plane.kubectl(
            "wait", "--for=condition=Established", "crd/machines.subres.dev", "--timeout=30s"
        )
    ).check()


def machine(name: str, namespace: str) -> str:
    return json.dumps(
        {
            "apiVersion": "subres.dev/v1alpha1",
            "kind": "Machine",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"console": {"endpoint": "tcp://127.0.0.1:5900"}},
        }
    )


def test_version_stamp_follows_the_kubernetes_module() -> None:
    # k8s.io/kubernetes is tagged v1.Y.Z itself; its staging modules v0.Y.Z.
    assert gotools.kube_version(gotools.TOOLS / "kube-apiserver" / "go.mod") == "v1.37.2"
    assert gotools.kube_version(gotools.TOOLS / "etcd" / "go.mod") is None


async def test_control_plane_serves_the_pinned_release(control_plane: ControlPlane) -> None:
    result = (await control_plane.kubectl("version", "-o", "json")).check()
    versions = result.json()
    assert versions["serverVersion"]["gitVersion"] == "v1.37.2"
    assert versions["clientVersion"]["gitVersion"] == "v1.37.2"
    assert await control_plane.api("GET", "/apis/apiregistration.k8s.io/v1") is not None


async def test_kubectl_applies_the_crd_and_round_trips_a_machine(
    control_plane: ControlPlane,
) -> None:
    await ensure_machine_crd(control_plane)
    await control_plane.ensure_namespace("e2e-machines")
    created = await control_plane.kubectl("apply", "-f", "-", stdin=machine("vm-1", "e2e-machines"))
    assert "machine.subres.dev/vm-1" in created.check().stdout

    got = (
        await control_plane.kubectl("get", "machine", "vm-1", "-n", "e2e-machines", "-o", "json")
    ).check()
    assert got.json()["spec"]["console"]["endpoint"] == "tcp://127.0.0.1:5900"
    # The short name and printer columns come from the CRD itself.
    listed = (await control_plane.kubectl("get", "mach", "-n", "e2e-machines")).check()
    assert "vm-1" in listed.stdout and "PHASE" in listed.stdout


async def test_static_token_user_is_forbidden_until_a_rolebinding_allows(
    control_plane: ControlPlane,
) -> None:
    await ensure_machine_crd(control_plane)
    namespace = "e2e-rbac"
    await control_plane.ensure_namespace(namespace)
    (await control_plane.kubectl("apply", "-f", "-", stdin=machine("vm-a", namespace))).check()

    denied = await control_plane.kubectl("get", "machines", "-n", namespace, user="alice")
    assert denied.returncode != 0
    assert 'User "alice" cannot list resource "machines"' in denied.stderr

    (
        await control_plane.kubectl(
            "create", "role", "machine-reader", "-n", namespace,
            "--verb=get,list", "--resource=machines.subres.dev",
        )
    ).check()  # fmt: skip
    (
        await control_plane.kubectl(
            "create", "rolebinding", "alice-reads-machines", "-n", namespace,
            "--role=machine-reader", "--user=alice",
        )
    ).check()  # fmt: skip

    # RBAC reads bindings through an informer: allowed a moment after the write.
    async def alice_may_list() -> bool:
        result = await control_plane.kubectl("get", "machines", "-n", namespace, user="alice")
        return result.returncode == 0 and "vm-a" in result.stdout

    assert await poll(alice_may_list, timeout_s=20.0), control_plane.logs()
    still_denied = await control_plane.kubectl("get", "machines", "-n", namespace, user="bob")
    assert still_denied.returncode != 0
    assert "forbidden" in still_denied.stderr.lower()


async def test_service_account_token_from_the_token_request_api(
    control_plane: ControlPlane,
) -> None:
    token = await control_plane.service_account_token("subres-system", "subres")
    kubeconfig = control_plane.token_kubeconfig("subres-sa", token)
    whoami = await control_plane.kubectl("auth", "whoami", "-o", "json", kubeconfig=kubeconfig)
    info = whoami.check().json()["status"]["userInfo"]
    assert info["username"] == "system:serviceaccount:subres-system:subres"
    assert "system:serviceaccounts:subres-system" in info["groups"]


async def test_delegated_auth_grants_let_a_service_account_read_and_review(
    control_plane: ControlPlane,
) -> None:
    namespace, name = "subres-delegation", "subres"
    token = await control_plane.service_account_token(namespace, name)
    configmap = "/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication"
    with pytest.raises(APIError) as denied:
        await control_plane.api("GET", configmap, token=token)
    assert denied.value.status == 403

    await grant_delegated_auth(control_plane, namespace=namespace, service_account=name)

    async def readable() -> bool:
        try:
            await control_plane.api("GET", configmap, token=token)
        except APIError as exc:
            assert exc.status == 403, exc
            return False
        return True

    assert await poll(readable, timeout_s=20.0)
    data = (await control_plane.api("GET", configmap, token=token))["data"]
    assert json.loads(data["requestheader-allowed-names"]) == [FRONT_PROXY_CLIENT]
    assert json.loads(data["requestheader-username-headers"]) == ["X-Remote-User"]
    assert data["requestheader-client-ca-file"] == control_plane.front_proxy_ca.cert_pem().decode()
    assert data["client-ca-file"] == control_plane.client_ca.cert_pem().decode()

    review = await control_plane.api(
        "POST",
        "/apis/authentication.k8s.io/v1/tokenreviews",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": control_plane.users["alice"].token},
        },
        token=token,
    )
    assert review["status"]["user"]["username"] == "alice"


async def test_endpointslices_may_not_point_at_loopback(control_plane: ControlPlane) -> None:
    # Why the aggregation helpers use an ExternalName Service instead.
    await control_plane.ensure_namespace("e2e-loopback")
    with pytest.raises(APIError) as refused:
        await control_plane.api(
            "POST",
            "/apis/discovery.k8s.io/v1/namespaces/e2e-loopback/endpointslices",
            {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {"name": "loopback"},
                "addressType": "IPv4",
                "endpoints": [{"addresses": ["127.0.0.1"]}],
                "ports": [{"port": 8443}],
            },
        )
    assert refused.value.status == 422
    assert "loopback" in refused.value.body


async def test_restarting_kube_apiserver_keeps_the_data(control_plane: ControlPlane) -> None:
    await ensure_machine_crd(control_plane)
    namespace = "e2e-restart"
    await control_plane.ensure_namespace(namespace)
    (await control_plane.kubectl("apply", "-f", "-", stdin=machine("survivor", namespace))).check()

    await control_plane.restart_apiserver()

    got = await control_plane.kubectl("get", "machine", "survivor", "-n", namespace, "-o", "json")
    assert got.check().json()["metadata"]["name"] == "survivor"


# -- aggregation through a stand-in aggregated server ---------------------


@dataclass(frozen=True)
class Seen:
    """One request the stand-in received, as kube-apiserver sent it."""

    path: str
    peer_cn: str | None
    user: str | None
    groups: tuple[str, ...]


@dataclass
class StandIn:
    """A stand-in aggregated API server listening on 127.0.0.1."""

    ca: certs.KeyPair
    port: int
    seen: list[Seen] = field(default_factory=list)

    def from_user(self, user: str) -> list[Seen]:
        return [request for request in self.seen if request.user == user]


def _peer_cn(request: web.Request) -> str | None:
    peer = request.transport.get_extra_info("peercert") if request.transport else None
    if not peer:
        return None
    for rdn in peer.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


def _standin_app(seen: list[Seen]) -> web.Application:
    async def discovery(request: web.Request) -> web.Response:
        user = request.headers.get("X-Remote-User")
        seen.append(
            Seen(
                path=request.path,
                peer_cn=_peer_cn(request),
                user=user,
                groups=tuple(request.headers.getall("X-Remote-Group", [])),
            )
        )
        body: dict[str, Any] = {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{GROUP}/{VERSION}",
            "resources": [
                {
                    "name": "machines/console",
                    "singularName": "",
                    "namespaced": True,
                    "kind": "MachineConsole",
                    "verbs": ["get", "create"],
                }
            ],
        }
        return web.json_response(body, headers={"X-Echo-Remote-User": user or ""})

    app = web.Application()
    app.router.add_get(f"/apis/{GROUP}/{VERSION}", discovery)
    return app


@pytest.fixture
async def standin(control_plane: ControlPlane, tmp_path: Path) -> AsyncIterator[StandIn]:
    ca = certs.generate_ca("stand-in aggregated server CA")
    dns_names, ips = certs.serving_names(STANDIN_SERVICE, STANDIN_NAMESPACE)
    serving = certs.issue_serving(
        ca, common_name=f"{STANDIN_SERVICE}.{STANDIN_NAMESPACE}.svc", dns_names=dns_names,
        ip_addresses=ips,
    )  # fmt: skip
    serving.write(tmp_path / "tls.crt", tmp_path / "tls.key")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    # Ask for the front-proxy client certificate, as a real aggregated server does.
    context.verify_mode = ssl.CERT_OPTIONAL
    context.load_verify_locations(cadata=control_plane.front_proxy_ca.cert_pem().decode())

    seen: list[Seen] = []
    runner = web.AppRunner(_standin_app(seen))
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context).start()
        yield StandIn(ca=ca, port=int(runner.addresses[0][1]), seen=seen)
    finally:
        await runner.cleanup()


async def test_apiservice_reaches_a_local_server_with_the_front_proxy_identity(
    control_plane: ControlPlane, standin: StandIn
) -> None:
    name = await register_apiservice(
        control_plane,
        group=GROUP,
        version=VERSION,
        namespace=STANDIN_NAMESPACE,
        service=STANDIN_SERVICE,
        port=standin.port,
        ca_bundle=standin.ca.cert_pem(),
    )
    try:
        await wait_apiservice_available(control_plane, name)
        # The availability probe came as the aggregator, over the front-proxy certificate.
        probes = standin.from_user("system:kube-aggregator")
        assert probes and probes[0].peer_cn == FRONT_PROXY_CLIENT
        assert "system:masters" in probes[0].groups

        for user in (ADMIN_USER, "alice"):
            before = len(standin.from_user(user))
            raw = await control_plane.kubectl("get", "--raw", f"/apis/{GROUP}/{VERSION}", user=user)
            assert raw.check().json()["groupVersion"] == f"{GROUP}/{VERSION}"
            [request] = standin.from_user(user)[before:]
            assert request.peer_cn == FRONT_PROXY_CLIENT
            assert request.path == f"/apis/{GROUP}/{VERSION}"
            assert "system:authenticated" in request.groups
        assert "system:masters" in standin.from_user(ADMIN_USER)[0].groups
        assert "subres:users" in standin.from_user("alice")[0].groups
    finally:
        await control_plane.api("DELETE", f"/apis/apiregistration.k8s.io/v1/apiservices/{name}")
