"""`subres certs`: every certificate an install needs, as a kustomize component.

Writes into `--out` one CA (`ca.crt`/`ca.key`) and the pairs it signs:
`tls.*` serving the APIService (SANs `<service>.<namespace>.svc` and its
short and long forms), `agent.*` serving every node agent
(`subres-agent.<agent namespace>.svc`), `replica.*` the replicas' certificate,
their client identity towards agents and each other and their serving
certificate on the peer port (CN and DNS name `subres-replica`). Then the manifests:
`secret.yaml` (the three `kubernetes.io/tls` Secrets the Deployment and the
DaemonSet mount, each with its `ca.crt`, the agents' in the agents' own
namespace), `apiservice-cabundle.yaml` (a
patch giving the APIService the CA) and `kustomization.yaml`, a kustomize
`Component` holding both, which `deploy/self-signed` includes; and
`values.yaml`, the same certificates as values of the Helm chart in
`deploy/chart` (`helm install … -f DIR/values.yaml`). Nothing needs
editing; none of it belongs in git (`.gitignore` says `deploy/certs/`).
"""

from __future__ import annotations

import argparse
import base64
from pathlib import Path

import yaml

from subres.serving import certs

__all__ = ["AGENT_CLIENT_SECRET", "AGENT_SECRET", "SECRET", "add_arguments", "run"]

SECRET = "subres-serving-cert"
AGENT_SECRET = "subres-agent-tls"
"""The agents' serving pair; its `ca.crt` is the CA replicas' client certificates chain to."""
AGENT_CLIENT_SECRET = "subres-agent-client"
"""The replicas' client pair for agents; its `ca.crt` is the CA agents' certificates chain to."""
APISERVICE = "v1alpha1.subresources.subres.dev"
AGENT_NAMESPACE = "subres-agents"
"""deploy/'s namespace of the node agents: their hostPath needs the `privileged` Pod
Security level, which the replicas' namespace (`restricted`) does not grant."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `certs` flags."""
    parser.add_argument("--service", default="subres", help="Service name")
    parser.add_argument("--namespace", default="subres-system", help="Service namespace")
    parser.add_argument(
        "--agent-namespace", default=AGENT_NAMESPACE, help="the node agents' namespace"
    )
    parser.add_argument("--out", type=Path, required=True, help="directory to write into")
    parser.add_argument(
        "--apiservice",
        default=APISERVICE,
        help="APIService the caBundle patch names (KubeVirt profile: v1.subresources.kubevirt.io)",
    )


def run(ns: argparse.Namespace) -> int:
    """Write the files; the exit code."""
    out: Path = ns.out
    out.mkdir(parents=True, exist_ok=True, mode=0o700)
    ca = certs.generate_ca(f"{ns.service}.{ns.namespace} CA")
    dns_names, _ = certs.serving_names(ns.service, ns.namespace)
    pairs = {
        "tls": certs.issue_serving(
            ca,
            common_name=f"{ns.service}.{ns.namespace}.svc",
            dns_names=[n for n in dns_names if n != "localhost"],
            ip_addresses=[],
        ),
        "agent": certs.issue_agent_serving(ca, namespace=ns.agent_namespace),
        "replica": certs.issue_replica_client(ca),
    }
    ca.write(out / "ca.crt", out / "ca.key")
    for name, pair in pairs.items():
        pair.write(out / f"{name}.crt", out / f"{name}.key")
    secrets = [
        _secret(SECRET, pairs["tls"], ca=ca, namespace=ns.namespace),
        _secret(AGENT_SECRET, pairs["agent"], ca=ca, namespace=ns.agent_namespace),
        _secret(AGENT_CLIENT_SECRET, pairs["replica"], ca=ca, namespace=ns.namespace),
    ]
    _write(out / "secret.yaml", yaml.safe_dump_all(secrets))
    _write(out / "apiservice-cabundle.yaml", yaml.safe_dump(_patch(ca, ns.apiservice)))
    _write(out / "kustomization.yaml", yaml.safe_dump(_component()))
    _write(out / "values.yaml", _helm_values(ca, pairs))
    print(f"wrote {out}/: a kustomize component (kustomization.yaml, secret.yaml, ")
    print("apiservice-cabundle.yaml), Helm values (values.yaml) and the PEM files;")
    print("keep them out of git")
    return 0


def _write(path: Path, text: str) -> None:
    # Secrets inside: readable by their owner only.
    path.touch(mode=0o600)
    path.write_text(text)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _secret(
    name: str, pair: certs.KeyPair, *, ca: certs.KeyPair, namespace: str
) -> dict[str, object]:
    # ca.crt in each, as cert-manager writes them: the agents and replicas verify each other
    # with it, and a scraper the serving certificate (deploy/components/monitoring).
    data = {"tls.crt": pair.cert_pem(), "tls.key": pair.key_pem(), "ca.crt": ca.cert_pem()}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {"name": name, "namespace": namespace},
        "data": {key: _b64(value) for key, value in data.items()},
    }


def _patch(ca: certs.KeyPair, apiservice: str) -> dict[str, object]:
    return {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {"name": apiservice},
        "spec": {"caBundle": _b64(ca.cert_pem()), "insecureSkipTLSVerify": False},
    }


class _BlockDumper(yaml.SafeDumper):
    """Writes multi-line strings (the PEM blocks) as `|` literals, as a person would."""


def _literal(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_BlockDumper.add_representer(str, _literal)


def _helm_values(ca: certs.KeyPair, pairs: dict[str, certs.KeyPair]) -> str:
    """deploy/chart's `certificates` values for the Secrets above (no CA key: no one needs it)."""

    def pem(pair: certs.KeyPair) -> dict[str, str]:
        return {"cert": pair.cert_pem().decode(), "key": pair.key_pem().decode()}

    values = {
        "certificates": {
            "source": "selfSigned",
            "selfSigned": {
                "ca": ca.cert_pem().decode(),
                "serving": pem(pairs["tls"]),
                "agent": pem(pairs["agent"]),
                "replica": pem(pairs["replica"]),
            },
        }
    }
    header = "# deploy/chart's certificates from `subres certs`: private keys, keep out of git.\n"
    return header + yaml.dump(values, Dumper=_BlockDumper, sort_keys=False)


def _component() -> dict[str, object]:
    return {
        "apiVersion": "kustomize.config.k8s.io/v1alpha1",
        "kind": "Component",
        "resources": ["secret.yaml"],
        "patches": [{"path": "apiservice-cabundle.yaml"}],
    }
