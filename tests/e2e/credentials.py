"""Every credential file a throwaway control plane needs, made with `cryptography`.

Owns the PKI directory: kube-apiserver's serving certificate and its CA, the
client CA with an admin in ``system:masters``, the front-proxy CA and the
client certificate kube-apiserver presents to aggregated servers, the
service-account signing key, the static token file (``alice``, ``bob``), and
kubeconfigs (admin by certificate, anyone by bearer token). Certificates come
from ``subres.serving.certs``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from subres.serving import certs

__all__ = [
    "ADMIN_USER",
    "FRONT_PROXY_CLIENT",
    "STATIC_USERS",
    "Pki",
    "StaticUser",
    "admin_user_entry",
    "cert_user_entry",
    "write_kubeconfig",
    "write_pki",
]

ADMIN_USER = "admin"
"""CN of the admin client certificate (in ``system:masters``)."""

FRONT_PROXY_CLIENT = "front-proxy-client"
"""CN of kube-apiserver's proxy client certificate, the only allowed request-header name."""


@dataclass(frozen=True)
class StaticUser:
    """A user of ``--token-auth-file``."""

    name: str
    """User name."""
    token: str
    """Bearer token."""
    groups: tuple[str, ...] = ()
    """Groups besides ``system:authenticated``."""


STATIC_USERS = (
    StaticUser(name="alice", token="alice-token-e2e", groups=("subres:users",)),
    StaticUser(name="bob", token="bob-token-e2e"),
)
"""The users the token file knows; none has any RBAC permission to begin with."""


@dataclass(frozen=True)
class Pki:
    """The credentials of one control plane and where their files are."""

    dir: Path
    """Directory holding every file below (mode 0700)."""
    server_ca: certs.KeyPair
    """Signed kube-apiserver's serving certificate (``server-ca.crt``)."""
    client_ca: certs.KeyPair
    """``--client-ca-file`` (``client-ca.crt``)."""
    admin: certs.KeyPair
    """Admin client certificate (``admin.crt``/``admin.key``)."""
    front_proxy_ca: certs.KeyPair
    """``--requestheader-client-ca-file`` (``front-proxy-ca.crt``)."""
    front_proxy_client: certs.KeyPair
    """``--proxy-client-cert-file`` (``front-proxy-client.crt``/``.key``)."""

    def file(self, name: str) -> Path:
        """A file of the directory, e.g. ``file("apiserver.crt")``."""
        return self.dir / name


def write_pki(directory: Path, *, addresses: Sequence[str] = ("127.0.0.1",)) -> Pki:
    """Generate every credential into `directory` (created, mode 0700).

    kube-apiserver's serving certificate names `addresses` (where it listens).
    """
    directory.mkdir(mode=0o700, parents=True)
    server_ca = certs.generate_ca("subres-e2e server CA")
    serving = certs.issue_serving(
        server_ca,
        common_name="kube-apiserver",
        dns_names=[
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ],
        # 10.0.0.1 is the `kubernetes` Service's ClusterIP in the default range.
        ip_addresses=[*addresses, "10.0.0.1"],
    )
    client_ca = certs.generate_ca("subres-e2e client CA")
    admin = certs.issue_client(client_ca, user=ADMIN_USER, groups=["system:masters"])
    front_proxy_ca = certs.generate_ca("subres-e2e front-proxy CA")
    front_proxy_client = certs.issue_client(front_proxy_ca, user=FRONT_PROXY_CLIENT, groups=[])
    # What kube-apiserver presents to kubelets (logs, exec, port-forward).
    kubelet_client = certs.issue_client(
        client_ca, user="kube-apiserver-kubelet-client", groups=["system:masters"]
    )

    _write(directory / "server-ca.crt", server_ca.cert_pem())
    serving.write(directory / "apiserver.crt", directory / "apiserver.key")
    _write(directory / "client-ca.crt", client_ca.cert_pem())
    admin.write(directory / "admin.crt", directory / "admin.key")
    _write(directory / "front-proxy-ca.crt", front_proxy_ca.cert_pem())
    front_proxy_client.write(
        directory / "front-proxy-client.crt", directory / "front-proxy-client.key"
    )
    kubelet_client.write(directory / "kubelet-client.crt", directory / "kubelet-client.key")
    _write_service_account_key(directory / "sa.key", directory / "sa.pub")
    _write_token_file(directory / "tokens.csv", STATIC_USERS)
    return Pki(
        dir=directory,
        server_ca=server_ca,
        client_ca=client_ca,
        admin=admin,
        front_proxy_ca=front_proxy_ca,
        front_proxy_client=front_proxy_client,
    )


def write_kubeconfig(path: Path, *, server: str, ca: bytes, user: Mapping[str, str]) -> None:
    """A one-context kubeconfig for `server` trusting `ca` with `user`'s credentials.

    `user` is a kubeconfig ``user`` entry: ``{"token": ...}`` or the
    ``client-certificate-data``/``client-key-data`` pair.
    """
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "e2e",
                "cluster": {
                    "server": server,
                    "certificate-authority-data": base64.b64encode(ca).decode(),
                },
            }
        ],
        "users": [{"name": "e2e", "user": dict(user)}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "e2e"}}],
        "current-context": "e2e",
    }
    # JSON is YAML: kubectl reads it as a kubeconfig.
    _write(path, json.dumps(config, indent=2).encode(), mode=0o600)


def admin_user_entry(pki: Pki) -> dict[str, str]:
    """The kubeconfig ``user`` entry of the admin certificate."""
    return cert_user_entry(pki.admin)


def cert_user_entry(pair: certs.KeyPair) -> dict[str, str]:
    """The kubeconfig ``user`` entry of a client certificate."""
    return {
        "client-certificate-data": base64.b64encode(pair.cert_pem()).decode(),
        "client-key-data": base64.b64encode(pair.key_pem()).decode(),
    }


def _write(path: Path, data: bytes, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(mode)


def _write_service_account_key(private: Path, public: Path) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    _write(
        private,
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
        mode=0o600,
    )
    _write(
        public,
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
    )


def _write_token_file(path: Path, users: Sequence[StaticUser]) -> None:
    # token,user,uid,"group1,group2" (the groups column is one quoted CSV field).
    lines = [
        f'{user.token},{user.name},uid-{user.name},"{",".join(user.groups)}"' for user in users
    ]
    _write(path, ("\n".join(lines) + "\n").encode(), mode=0o600)
