"""The real control plane the e2e suite stands on: kubectl, RBAC, tokens, restarts.

What an aggregated server needs of it (delegated-auth grants, the authentication
ConfigMap, why EndpointSlices cannot point at loopback) is checked here;
``test_subres.py`` registers the real subres through it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import gotools
from tests.e2e.aggregation import grant_delegated_auth
from tests.e2e.controlplane import APIError, ControlPlane, poll
from tests.e2e.credentials import FRONT_PROXY_CLIENT

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "deploy" / "base" / "crd-machine.yaml"


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
