"""Certificates made with `cryptography`: CAs, serving and client certificates.

Owns X.509 generation and writing key pairs to disk: a self-signed CA, a
serving certificate naming the Service (kube-apiserver dials
`<service>.<namespace>.svc`), client certificates (CN = user, O = groups) for
tests and the demo, and the self-signed pair `--cert-dir` falls back to when
no `--tls-cert-file` is given. Building TLS contexts from the files is
`tls.py`'s job.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "AGENT_SERVICE",
    "CA_VALIDITY",
    "LEAF_VALIDITY",
    "REPLICA_IDENTITY",
    "KeyPair",
    "ServingFiles",
    "ensure_self_signed",
    "generate_ca",
    "issue_agent_serving",
    "issue_client",
    "issue_replica_client",
    "issue_serving",
    "serving_names",
]

AGENT_SERVICE = "subres-agent"
"""The name node agents' serving certificates carry, as `<it>.<namespace>.svc`."""
REPLICA_IDENTITY = "subres-replica"
"""Common name of the client certificate replicas present to node agents."""

CA_VALIDITY = datetime.timedelta(days=3650)
"""How long a generated CA is valid."""

LEAF_VALIDITY = datetime.timedelta(days=365)
"""How long an issued serving or client certificate is valid (never past its CA)."""

# Backdating lets a peer whose clock runs a little behind ours accept a fresh certificate.
_CLOCK_SKEW = datetime.timedelta(minutes=5)

_SERVING_CERT = "apiserver.crt"
_SERVING_KEY = "apiserver.key"
_CA_CERT = "ca.crt"
_CA_KEY = "ca.key"


@dataclass(frozen=True)
class KeyPair:
    """A certificate and its private key."""

    cert: x509.Certificate
    """The certificate."""
    key: ec.EllipticCurvePrivateKey
    """The private key matching `cert`'s public key."""

    def cert_pem(self) -> bytes:
        """The certificate as PEM."""
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def key_pem(self) -> bytes:
        """The private key as unencrypted PKCS#8 PEM."""
        return self.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    def write(self, cert_path: Path, key_path: Path) -> None:
        """Replace both files atomically, the key readable by its owner only.

        Each file is swapped in by rename, never seen half-written; a reader
        may still see the new key beside the old certificate for a moment,
        which `tls.ReloadingTLS` rejects and retries.
        """
        _write_atomic(key_path, self.key_pem(), mode=0o600)
        _write_atomic(cert_path, self.cert_pem(), mode=0o644)


@dataclass(frozen=True)
class ServingFiles:
    """Where the serving certificate, its key and the CA that signed it are."""

    cert: Path
    """PEM serving certificate (`--tls-cert-file`)."""
    key: Path
    """PEM private key (`--tls-private-key-file`)."""
    ca: Path | None
    """PEM CA for the APIService's `caBundle`; None when the pair was provided without one."""


def generate_ca(common_name: str) -> KeyPair:
    """A self-signed CA that may sign leaf certificates only."""
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(now + CA_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert=cert, key=key)


def issue_serving(
    ca: KeyPair, *, common_name: str, dns_names: list[str], ip_addresses: list[str]
) -> KeyPair:
    """A serving certificate for exactly the given DNS names and IP addresses."""
    sans: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    return _issue(ca, subject=subject, usage=ExtendedKeyUsageOID.SERVER_AUTH, sans=sans)


def issue_client(ca: KeyPair, *, user: str, groups: list[str]) -> KeyPair:
    """A client certificate that Kubernetes reads as `user` in `groups` (CN and each O)."""
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, group) for group in groups]
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, user))
    return _issue(ca, subject=x509.Name(attributes), usage=ExtendedKeyUsageOID.CLIENT_AUTH, sans=[])


def issue_agent_serving(ca: KeyPair, *, namespace: str) -> KeyPair:
    """The serving certificate of every node agent: one name, since they are dialed by IP."""
    name = f"{AGENT_SERVICE}.{namespace}.svc"
    return issue_serving(
        ca, common_name=name, dns_names=[name, f"{name}.cluster.local"], ip_addresses=[]
    )


def issue_replica_client(ca: KeyPair) -> KeyPair:
    """The replicas' certificate: their client identity towards node agents and each other,
    and their serving certificate on the peer port (CN and DNS name `subres-replica`)."""
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, REPLICA_IDENTITY)])
    return _issue(
        ca,
        subject=subject,
        usage=[ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.SERVER_AUTH],
        sans=[x509.DNSName(REPLICA_IDENTITY)],
    )


def serving_names(service: str, namespace: str) -> tuple[list[str], list[str]]:
    """DNS names and IP addresses a serving certificate for the Service needs."""
    dns_names = [
        "localhost",
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    ]
    return dns_names, ["127.0.0.1", "::1"]


def ensure_self_signed(cert_dir: Path, *, service: str, namespace: str) -> ServingFiles:
    """The serving pair in `cert_dir`, generated with its own CA unless already there."""
    cert, key, ca = cert_dir / _SERVING_CERT, cert_dir / _SERVING_KEY, cert_dir / _CA_CERT
    if not (cert.exists() and key.exists()):
        _write_self_signed(cert_dir, service=service, namespace=namespace)
    return ServingFiles(cert=cert, key=key, ca=ca if ca.exists() else None)


def _write_self_signed(cert_dir: Path, *, service: str, namespace: str) -> None:
    _private_dirs(cert_dir)
    ca = generate_ca(f"{service}.{namespace} self-signed CA")
    dns_names, ip_addresses = serving_names(service, namespace)
    serving = issue_serving(
        ca,
        common_name=f"{service}.{namespace}.svc",
        dns_names=dns_names,
        ip_addresses=ip_addresses,
    )
    ca.write(cert_dir / _CA_CERT, cert_dir / _CA_KEY)
    # The serving pair last: its presence is what marks the directory as complete.
    serving.write(cert_dir / _SERVING_CERT, cert_dir / _SERVING_KEY)


def _private_dirs(path: Path) -> None:
    """Make `path` and whichever of its parents are missing, each for its owner only (0700);
    directories that exist keep their modes."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for directory in reversed(missing):
        directory.mkdir(mode=0o700, exist_ok=True)
        directory.chmod(0o700)  # whatever the umask


def _issue(
    ca: KeyPair,
    *,
    subject: x509.Name,
    usage: x509.ObjectIdentifier | list[x509.ObjectIdentifier],
    sans: list[x509.GeneralName],
) -> KeyPair:
    key = _new_key()
    now = _now()
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(min(now + LEAF_VALIDITY, ca.cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(usage if isinstance(usage, list) else [usage]), critical=False
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),
            critical=False,
        )
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return KeyPair(cert=builder.sign(ca.key, hashes.SHA256()), key=key)


def _key_usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _write_atomic(path: Path, data: bytes, *, mode: int) -> None:
    # A temporary file in the same directory, so the rename cannot cross filesystems.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as file:
            os.fchmod(file.fileno(), mode)
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
