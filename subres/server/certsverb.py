"""`subres certs`: a CA and serving certificate for the Service, as deployable manifests.

Writes into `--out`: `ca.crt`/`ca.key`, `tls.crt`/`tls.key` (SANs for
`<service>.<namespace>.svc` and its short and long forms), `secret.yaml`
(the `kubernetes.io/tls` Secret the Deployment mounts) and
`apiservice-cabundle.yaml` (a patch giving the APIService the CA).
"""

from __future__ import annotations

import argparse
import base64
from pathlib import Path

import yaml

from subres.server import certs

__all__ = ["add_arguments", "run"]

SECRET = "subres-serving-cert"
APISERVICE = "v1alpha1.subresources.subres.dev"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `certs` flags."""
    parser.add_argument("--service", default="subres", help="Service name")
    parser.add_argument("--namespace", default="subres-system", help="Service namespace")
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
    serving = certs.issue_serving(
        ca,
        common_name=f"{ns.service}.{ns.namespace}.svc",
        dns_names=[n for n in dns_names if n != "localhost"],
        ip_addresses=[],
    )
    ca.write(out / "ca.crt", out / "ca.key")
    serving.write(out / "tls.crt", out / "tls.key")
    (out / "secret.yaml").write_text(yaml.safe_dump(_secret(serving, ca, ns.namespace)))
    (out / "apiservice-cabundle.yaml").write_text(yaml.safe_dump(_patch(ca, ns.apiservice)))
    print(f"wrote {out}/{{ca.crt,tls.crt,tls.key,secret.yaml,apiservice-cabundle.yaml}}")
    return 0


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _secret(serving: certs.KeyPair, ca: certs.KeyPair, namespace: str) -> dict[str, object]:
    # ca.crt too (as cert-manager writes it): a scraper verifies the serving certificate
    # with it (deploy/components/monitoring).
    data = {"tls.crt": serving.cert_pem(), "tls.key": serving.key_pem(), "ca.crt": ca.cert_pem()}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {"name": SECRET, "namespace": namespace},
        "data": {key: _b64(value) for key, value in data.items()},
    }


def _patch(ca: certs.KeyPair, apiservice: str) -> dict[str, object]:
    return {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {"name": apiservice},
        "spec": {"caBundle": _b64(ca.cert_pem()), "insecureSkipTLSVerify": False},
    }
