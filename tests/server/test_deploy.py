"""deploy/ parses and says what the contract needs; `subres certs` writes usable files."""

from __future__ import annotations

import argparse
import base64
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509

from subres.main import main
from subres.server.options import add_arguments

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def documents() -> dict[tuple[str, str], dict[str, Any]]:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    docs = {}
    for name in kustomization["resources"]:
        for doc in yaml.safe_load_all((DEPLOY / name).read_text()):
            docs[(doc["kind"], doc["metadata"]["name"])] = doc
    return docs


def test_manifests_hold_the_contract() -> None:
    docs = documents()
    assert docs[("ClusterRoleBinding", "subres:system:auth-delegator")]["roleRef"]["name"] == (
        "system:auth-delegator"
    )
    reader = docs[("RoleBinding", "subres:extension-apiserver-authentication-reader")]
    assert reader["metadata"]["namespace"] == "kube-system"
    user = docs[("ClusterRole", "subres-machine-user")]["rules"][0]
    assert set(user["verbs"]) == {"get", "create"}
    assert "machines/portforward" in user["resources"]
    viewer = docs[("ClusterRole", "subres-screenshot-viewer")]["rules"][0]
    assert (viewer["resources"], viewer["verbs"]) == (["machines/screenshot"], ["get"])
    pod = docs[("Deployment", "subres")]["spec"]
    assert pod["replicas"] == 2
    container = pod["template"]["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert container["securityContext"]["readOnlyRootFilesystem"]
    api = docs[("APIService", "v1alpha1.subresources.subres.dev")]["spec"]
    assert (api["group"], api["version"]) == ("subresources.subres.dev", "v1alpha1")
    assert 1 <= api["groupPriorityMinimum"] <= 20000 and 1 <= api["versionPriority"] <= 1000
    assert ("PodDisruptionBudget", "subres") in docs


def test_the_kubelet_waits_longer_than_the_server_drains() -> None:
    pod = documents()[("Deployment", "subres")]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    options, _ = parser.parse_known_args(container["args"][1:])
    assert options.shutdown_delay > 0, "endpoints need time to stop sending requests"
    drain = options.shutdown_delay + options.shutdown_grace
    # The kubelet kills at terminationGracePeriodSeconds: leave room for the exit itself.
    assert pod["terminationGracePeriodSeconds"] >= drain + 5
    # The delay happens inside subres; a preStop hook would only delay SIGTERM further.
    assert "lifecycle" not in container


def test_the_server_may_keep_session_leases_in_its_own_namespace() -> None:
    docs = documents()
    role = docs[("Role", "subres:session-leases")]
    binding = docs[("RoleBinding", "subres:session-leases")]
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "subres-system"
    [rule] = role["rules"]
    assert (rule["apiGroups"], rule["resources"]) == (["coordination.k8s.io"], ["leases"])
    assert set(rule["verbs"]) >= {"get", "list", "watch", "create", "update", "delete"}
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "subres:session-leases",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "subres", "namespace": "subres-system"}
    ]


def test_certs_verb_writes_secret_and_cabundle(tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = ["certs", "--service", "subres", "--namespace", "subres-system", "--out", str(out)]
    assert main(argv) == 0
    secret = yaml.safe_load((out / "secret.yaml").read_text())
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "subres.subres-system.svc" in names.get_values_for_type(x509.DNSName)
    patch = yaml.safe_load((out / "apiservice-cabundle.yaml").read_text())
    ca = x509.load_pem_x509_certificate(base64.b64decode(patch["spec"]["caBundle"]))
    cert.verify_directly_issued_by(ca)
    assert secret["metadata"]["namespace"] == "subres-system"


def test_monitoring_component_scrapes_the_service_with_the_rbac_it_needs(tmp_path: Path) -> None:
    component = DEPLOY / "components" / "monitoring"
    kustomization = yaml.safe_load((component / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Component"
    docs = {
        (doc["kind"], doc["metadata"]["name"]): doc
        for name in kustomization["resources"]
        for doc in yaml.safe_load_all((component / name).read_text())
    }
    service = documents()[("Service", "subres")]
    monitor = docs[("ServiceMonitor", "subres")]["spec"]
    labels = service["metadata"]["labels"]
    assert monitor["selector"]["matchLabels"].items() <= labels.items()
    (endpoint,) = monitor["endpoints"]
    assert endpoint["port"] in {port["name"] for port in service["spec"]["ports"]}
    assert (endpoint["scheme"], endpoint["path"]) == ("https", "/metrics")
    # The CA and name it verifies with are what `subres certs` writes.
    out = tmp_path / "out"
    assert main(["certs", "--out", str(out)]) == 0
    secret = yaml.safe_load((out / "secret.yaml").read_text())
    tls = endpoint["tlsConfig"]
    assert tls["ca"]["secret"]["name"] == secret["metadata"]["name"]
    ca = x509.load_pem_x509_certificate(
        base64.b64decode(secret["data"][tls["ca"]["secret"]["key"]])
    )
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert tls["serverName"] in names.get_values_for_type(x509.DNSName)
    role = docs[("ClusterRole", "subres-metrics-reader")]
    assert role["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    binding = docs[("ClusterRoleBinding", "subres-metrics-reader")]
    assert binding["roleRef"]["name"] == "subres-metrics-reader"


def test_certs_verb_names_the_kubevirt_profiles_apiservice(tmp_path: Path) -> None:
    argv = ["certs", "--out", str(tmp_path), "--apiservice", "v1.subresources.kubevirt.io"]
    assert main(argv) == 0
    patch = yaml.safe_load((tmp_path / "apiservice-cabundle.yaml").read_text())
    assert patch["metadata"]["name"] == "v1.subresources.kubevirt.io"
    profile = yaml.safe_load((DEPLOY.parent / "examples/kubevirt/apiservice.yaml").read_text())
    assert profile["metadata"]["name"] == patch["metadata"]["name"]
