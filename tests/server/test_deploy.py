"""deploy/ parses and says what the contract needs; `subres certs` writes usable files."""

from __future__ import annotations

import argparse
import base64
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509

from subres import config as configfile
from subres.main import main
from subres.server.options import add_arguments

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
BASE = DEPLOY / "base"


def documents() -> dict[tuple[str, str], dict[str, Any]]:
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    docs = {}
    for name in kustomization["resources"]:
        for doc in yaml.safe_load_all((BASE / name).read_text()):
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
    editors = docs[("ClusterRole", "subres-machine-user")]["rules"]
    usb = {"apiGroups": ["subresources.subres.dev"], "resources": ["machines/usbredir"]}
    assert {**usb, "verbs": ["get"]} in editors
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
    # No placeholder: the caBundle comes from an overlay.
    assert "caBundle" not in api


def test_crd_keeps_the_backends_in_status_that_editors_cannot_write() -> None:
    docs = documents()
    [version] = docs[("CustomResourceDefinition", "machines.subres.dev")]["spec"]["versions"]
    assert version["subresources"]["status"] == {}
    schema = version["schema"]["openAPIV3Schema"]
    machines = configfile.Config().parent("machines")
    assert machines is not None
    for sub in machines.subresources.values():
        for path in filter(None, (sub.endpoint, sub.address, sub.ports)):
            assert path.startswith(".status."), path
            node = schema
            for part in path.strip(".").split("."):
                node = node["properties"][part]  # the CRD would prune an unknown field
    edit = docs[("ClusterRole", "subres-machines-edit")]
    labels = edit["metadata"]["labels"]
    assert labels["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert labels["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
    granted = {r for rule in edit["rules"] for r in rule["resources"]}
    assert granted == {"machines"}


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


def test_only_the_server_may_write_leases_in_its_namespace() -> None:
    docs = documents()
    role = docs[("Role", "subres:replica-leases")]
    binding = docs[("RoleBinding", "subres:replica-leases")]
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "subres-system"
    [rule] = role["rules"]
    assert (rule["apiGroups"], rule["resources"]) == (["coordination.k8s.io"], ["leases"])
    assert set(rule["verbs"]) >= {"get", "list", "watch", "create", "update", "delete"}
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "subres:replica-leases",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "subres", "namespace": "subres-system"}
    ]
    # A forged membership Lease is a threat only to those who may write one: nothing else
    # in deploy/ grants Lease writes (or a wildcard) to anyone.
    for (kind, name), doc in docs.items():
        if kind not in ("Role", "ClusterRole") or name == "subres:replica-leases":
            continue
        for other in doc.get("rules") or ():
            groups, resources = other.get("apiGroups", []), other.get("resources", [])
            writes = set(other.get("verbs", [])) & {"create", "update", "patch", "*"}
            assert not (
                {"coordination.k8s.io", "*"} & set(groups)
                and {"leases", "*"} & set(resources)
                and writes
            ), f"{kind} {name} grants Lease writes"


def test_replica_pods_carry_the_replica_selector_and_the_peer_port() -> None:
    deployment = documents()[("Deployment", "subres")]
    pod = deployment["spec"]["template"]
    [container] = pod["spec"]["containers"]
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    options, _ = parser.parse_known_args(container["args"][1:])
    wanted = dict(pair.split("=") for pair in options.replica_selector.split(","))
    assert wanted.items() <= pod["metadata"]["labels"].items()
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert f"--peer-port={ports['peer']}" in container["args"]


def test_editors_get_the_interactive_subresources_and_screenshots_stay_opt_in() -> None:
    docs = documents()
    labels = docs[("ClusterRole", "subres-machine-user")]["metadata"]["labels"]
    assert labels == {
        "rbac.authorization.k8s.io/aggregate-to-edit": "true",
        "rbac.authorization.k8s.io/aggregate-to-admin": "true",
    }
    assert "labels" not in docs[("ClusterRole", "subres-screenshot-viewer")]["metadata"]


def test_the_agent_daemonset_mounts_one_narrow_socket_directory() -> None:
    docs = documents()
    daemonset = docs[("DaemonSet", "subres-agent")]["spec"]["template"]["spec"]
    assert daemonset["serviceAccountName"] == "subres-agent"
    assert daemonset["automountServiceAccountToken"] is False
    assert docs[("ServiceAccount", "subres-agent")]["automountServiceAccountToken"] is False
    [host] = [v["hostPath"]["path"] for v in daemonset["volumes"] if "hostPath" in v]
    # The replicas' default socket directory: what they vet is what the agents serve.
    assert host == configfile.DEFAULT_SOCKET_DIR
    [container] = daemonset["containers"]
    # Its sockets and their listeners must belong to the machines' runtime (root here).
    assert f"--socket-dir={host}=0:0" in container["args"]
    assert {"name": "relay", "containerPort": 8444, "protocol": "TCP"} in container["ports"]
    secrets = {v["secret"]["secretName"] for v in daemonset["volumes"] if "secret" in v}
    assert secrets == {"subres-agent-tls"}
    # Replicas find agents by pod and reach them with their own client certificate.
    replica = docs[("Deployment", "subres")]["spec"]["template"]["spec"]
    assert "--agent-ca-file=/etc/subres/agent/ca.crt" in replica["containers"][0]["args"]
    assert "--agent-namespace=subres-agents" in replica["containers"][0]["args"]
    finder = docs[("Role", "subres:agent-finder")]
    assert finder["metadata"]["namespace"] == "subres-agents"
    rule = finder["rules"][0]
    assert (rule["resources"], rule["verbs"]) == (["pods"], ["get", "list", "watch"])


def test_a_nodes_new_agent_is_ready_before_its_old_one_stops() -> None:
    # Kept consoles move to the new agent without waiting for it to start: the roll
    # surges, which two agents on one node allow only without host ports.
    daemonset = documents()[("DaemonSet", "subres-agent")]["spec"]
    assert daemonset["updateStrategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    pod = daemonset["template"]["spec"]
    assert not pod.get("hostNetwork")
    assert all("hostPort" not in p for c in pod["containers"] for p in c.get("ports", []))


def test_the_replicas_run_restricted_and_only_the_agents_namespace_admits_hostpaths() -> None:
    docs = documents()
    levels = {
        name: doc["metadata"]["labels"]["pod-security.kubernetes.io/enforce"]
        for (kind, name), doc in docs.items()
        if kind == "Namespace"
    }
    assert levels == {"subres-system": "restricted", "subres-agents": "privileged"}
    assert docs[("Deployment", "subres")]["metadata"]["namespace"] == "subres-system"
    assert docs[("DaemonSet", "subres-agent")]["metadata"]["namespace"] == "subres-agents"


def test_the_image_is_set_by_one_kustomize_images_entry() -> None:
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    assert [i["name"] for i in kustomization["images"]] == ["subres"]
    docs = documents()
    images = [
        c["image"]
        for kind, name in (("Deployment", "subres"), ("DaemonSet", "subres-agent"))
        for c in docs[(kind, name)]["spec"]["template"]["spec"]["containers"]
    ]
    assert images == ["subres", "subres"]


def test_the_cert_manager_overlay_injects_the_ca() -> None:
    overlay = yaml.safe_load((DEPLOY / "cert-manager" / "kustomization.yaml").read_text())
    assert overlay["resources"] == ["../base", "certificates.yaml"]
    [patch] = [yaml.safe_load(p["patch"]) for p in overlay["patches"]]
    assert patch["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": "subres-system/subres-serving-cert"
    }
    issued = {
        d["spec"]["secretName"]
        for d in yaml.safe_load_all((DEPLOY / "cert-manager" / "certificates.yaml").read_text())
        if d["kind"] == "Certificate"
    }
    assert issued == {"subres-ca", "subres-serving-cert", "subres-agent-tls", "subres-agent-client"}


def test_certs_verb_writes_a_component_with_secrets_and_cabundle(tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = ["certs", "--service", "subres", "--namespace", "subres-system", "--out", str(out)]
    assert main(argv) == 0
    component = yaml.safe_load((out / "kustomization.yaml").read_text())
    assert component["kind"] == "Component"
    assert component["resources"] == ["secret.yaml"]
    assert component["patches"] == [{"path": "apiservice-cabundle.yaml"}]
    secrets = {
        s["metadata"]["name"]: s for s in yaml.safe_load_all((out / "secret.yaml").read_text())
    }
    assert set(secrets) == {"subres-serving-cert", "subres-agent-tls", "subres-agent-client"}
    agent = x509.load_pem_x509_certificate(
        base64.b64decode(secrets["subres-agent-tls"]["data"]["tls.crt"])
    )
    assert (
        agent.extensions.get_extension_for_class(
            x509.SubjectAlternativeName
        ).value.get_values_for_type(x509.DNSName)[0]
        == "subres-agent.subres-agents.svc"
    )
    assert secrets["subres-agent-tls"]["metadata"]["namespace"] == "subres-agents"
    replica = x509.load_pem_x509_certificate(
        base64.b64decode(secrets["subres-agent-client"]["data"]["tls.crt"])
    )
    assert replica.subject.rfc4514_string() == "CN=subres-replica"
    assert (out / "secret.yaml").stat().st_mode & 0o077 == 0
    secret = secrets["subres-serving-cert"]
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "subres.subres-system.svc" in names.get_values_for_type(x509.DNSName)
    patch = yaml.safe_load((out / "apiservice-cabundle.yaml").read_text())
    ca = x509.load_pem_x509_certificate(base64.b64decode(patch["spec"]["caBundle"]))
    cert.verify_directly_issued_by(ca)
    agent.verify_directly_issued_by(ca)
    replica.verify_directly_issued_by(ca)
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
    secret = next(yaml.safe_load_all((out / "secret.yaml").read_text()))  # the serving one
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


def test_generated_certificates_are_ignored_by_git() -> None:
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", "deploy/certs/ca.key"],
        cwd=DEPLOY.parent,
        check=False,
    )
    assert ignored.returncode == 0


def test_certs_verb_names_the_kubevirt_profiles_apiservice(tmp_path: Path) -> None:
    argv = ["certs", "--out", str(tmp_path), "--apiservice", "v1.subresources.kubevirt.io"]
    assert main(argv) == 0
    patch = yaml.safe_load((tmp_path / "apiservice-cabundle.yaml").read_text())
    assert patch["metadata"]["name"] == "v1.subresources.kubevirt.io"
    profile = yaml.safe_load((DEPLOY.parent / "examples/kubevirt/apiservice.yaml").read_text())
    assert profile["metadata"]["name"] == patch["metadata"]["name"]


def test_observing_is_granted_apart_from_typing_and_recordings_apart_from_both() -> None:
    docs = documents()
    rules = docs[("ClusterRole", "subres-machine-observer")]["rules"]
    granted = {resource for rule in rules for resource in rule["resources"]}
    assert granted == {
        "machines/console-observe",
        "machines/vnc-observe",
        "machines/screenshot",
        "machines/sessions",
        "machines/log",
        "sessions",
    }
    assert "labels" not in docs[("ClusterRole", "subres-machine-observer")]["metadata"]
    editors = docs[("ClusterRole", "subres-machine-user")]["rules"]
    assert {"machines/console-observe", "machines/sessions", "sessions"} <= {
        resource for rule in editors for resource in rule["resources"]
    }
    reader = docs[("ClusterRole", "subres-recording-reader")]
    assert reader["rules"] == [
        {
            "apiGroups": ["subresources.subres.dev"],
            "resources": ["machines/recordings"],
            "verbs": ["get"],
        }
    ]
    assert reader["metadata"]["labels"] == {"rbac.authorization.k8s.io/aggregate-to-admin": "true"}
    logs = docs[("ClusterRole", "subres-machine-log-reader")]
    assert logs["metadata"]["labels"] == {"rbac.authorization.k8s.io/aggregate-to-view": "true"}
    assert [(r["resources"], r["verbs"]) for r in logs["rules"]] == [(["machines/log"], ["get"])]
    events = docs[("ClusterRole", "subres:session-events")]["rules"]
    assert events == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
    binding = docs[("ClusterRoleBinding", "subres:session-events")]
    assert binding["subjects"][0]["name"] == "subres"


def test_the_recordings_component_gives_the_replicas_a_shared_directory(
    tmp_path: Path, kubectl_bin: Path
) -> None:
    copy = tmp_path / "deploy"
    shutil.copytree(DEPLOY / "base", copy / "base")
    shutil.copytree(DEPLOY / "components", copy / "components")
    (copy / "overlay").mkdir()
    (copy / "overlay" / "kustomization.yaml").write_text(
        "resources: [../base]\ncomponents: [../components/recordings]\n"
    )
    built = subprocess.run(
        [str(kubectl_bin), "kustomize", str(copy / "overlay")],
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(built)}
    claim = docs[("PersistentVolumeClaim", "subres-recordings")]["spec"]
    assert claim["accessModes"] == ["ReadWriteMany"]
    pod = docs[("Deployment", "subres")]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    [config_arg] = [a for a in container["args"] if a.startswith("--config=")]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    [configmap] = [d for (kind, _), d in docs.items() if kind == "ConfigMap"]
    config = configfile.parse(yaml.safe_load(configmap["data"]["config.yaml"]))
    assert config_arg == f"--config={mounts['config']}/config.yaml"
    assert config.consoles.recordings == mounts["recordings"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["recordings"]["persistentVolumeClaim"]["claimName"] == "subres-recordings"
    assert volumes["config"]["configMap"]["name"] == configmap["metadata"]["name"]


def test_moderating_is_a_role_of_its_own() -> None:
    rules = documents()[("ClusterRole", "subres-machine-moderator")]["rules"]
    granted = {(r, v) for rule in rules for r in rule["resources"] for v in rule["verbs"]}
    assert {("machines/console-moderate", "delete"), ("machines/vnc-moderate", "get")} <= granted
    assert not any(r in ("machines/console", "machines/vnc") for r, _ in granted)


def test_the_streams_hold_no_seat_of_any_priority_level() -> None:
    """Every streaming subresource kube-apiserver proxies is in the install's FlowSchema, which
    sends it to the built-in `exempt` level (tests/e2e/test_flowcontrol.py applies it)."""
    docs = documents()
    assert not any(kind == "PriorityLevelConfiguration" for kind, _ in docs)
    schema = docs[("FlowSchema", "subres-streams")]["spec"]
    assert schema["priorityLevelConfiguration"]["name"] == "exempt"
    assert schema["matchingPrecedence"] < 9000  # before service-accounts and global-default
    [rule] = schema["rules"]
    assert rule["subjects"] == [{"kind": "Group", "group": {"name": "system:authenticated"}}]
    [resources] = rule["resourceRules"]
    machines = configfile.Config().parent("machines")
    assert machines is not None
    streams = {*machines.subresources, "log"} - {"screenshot"}
    streams |= {f"{sub}-{how}" for sub in ("console", "vnc") for how in ("observe", "moderate")}
    assert set(resources["resources"]) == {f"machines/{sub}" for sub in streams}
    assert (set(resources["verbs"]), resources["apiGroups"]) == (
        {"get", "create"},
        ["subresources.subres.dev"],
    )


def test_every_shipped_overlay_builds_and_carries_the_streams_flowschema(
    tmp_path: Path, kubectl_bin: Path
) -> None:
    shutil.copytree(DEPLOY, tmp_path / "deploy")
    shutil.copytree(DEPLOY.parent / "examples", tmp_path / "examples")
    assert main(["certs", "--out", str(tmp_path / "deploy" / "certs")]) == 0
    kubevirt = tmp_path / "examples" / "kubevirt"
    apiservice = "v1.subresources.kubevirt.io"
    assert main(["certs", "--apiservice", apiservice, "--out", str(kubevirt / "certs")]) == 0
    for overlay, group in (
        (tmp_path / "deploy" / "self-signed", "subresources.subres.dev"),
        (tmp_path / "deploy" / "cert-manager", "subresources.subres.dev"),
        (kubevirt, "subresources.kubevirt.io"),
    ):
        built = subprocess.run(
            [str(kubectl_bin), "kustomize", str(overlay)],
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
        docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(built)}
        [rule] = docs[("FlowSchema", "subres-streams")]["spec"]["rules"]
        assert rule["resourceRules"][0]["apiGroups"] == [group], overlay


def test_certs_writes_the_charts_values_for_the_same_secrets(tmp_path: Path) -> None:
    assert main(["certs", "--out", str(tmp_path)]) == 0
    values = yaml.safe_load((tmp_path / "values.yaml").read_text())["certificates"]
    assert values["source"] == "selfSigned"
    pem = values["selfSigned"]
    assert pem["ca"] == (tmp_path / "ca.crt").read_text()
    for pair, files in (("serving", "tls"), ("agent", "agent"), ("replica", "replica")):
        assert pem[pair]["cert"] == (tmp_path / f"{files}.crt").read_text()
        assert pem[pair]["key"] == (tmp_path / f"{files}.key").read_text()
    assert "ca.key" not in (tmp_path / "values.yaml").read_text()
    assert (tmp_path / "values.yaml").stat().st_mode & 0o077 == 0
    # Every key it writes is one the chart has.
    defaults = yaml.safe_load((DEPLOY / "chart" / "values.yaml").read_text())["certificates"]
    assert set(values) <= set(defaults)
    assert set(pem) == set(defaults["selfSigned"])
