"""Certificate generation: extensions, names, real handshakes and the --cert-dir fallback."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import ssl
import stat
from pathlib import Path
from typing import TypeVar

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from subres.serving import certs

SERVICE_HOST = "subres.subres-system.svc"

_E = TypeVar("_E", bound=x509.ExtensionType)


@pytest.fixture(scope="module")
def ca() -> certs.KeyPair:
    return certs.generate_ca("test CA")


@pytest.fixture(scope="module")
def serving(ca: certs.KeyPair) -> certs.KeyPair:
    dns_names, ip_addresses = certs.serving_names("subres", "subres-system")
    return certs.issue_serving(
        ca, common_name=SERVICE_HOST, dns_names=dns_names, ip_addresses=ip_addresses
    )


def _extension(cert: x509.Certificate, kind: type[_E]) -> x509.Extension[_E]:
    return cert.extensions.get_extension_for_class(kind)


def test_serving_names() -> None:
    assert certs.serving_names("subres", "subres-system") == (
        [
            "localhost",
            "subres",
            "subres.subres-system",
            "subres.subres-system.svc",
            "subres.subres-system.svc.cluster.local",
        ],
        ["127.0.0.1", "::1"],
    )


def test_ca_is_a_self_signed_signing_ca(ca: certs.KeyPair) -> None:
    constraints = _extension(ca.cert, x509.BasicConstraints)
    assert constraints.critical
    assert constraints.value.ca
    assert _extension(ca.cert, x509.KeyUsage).value.key_cert_sign
    assert _extension(ca.cert, x509.SubjectKeyIdentifier).value.digest
    ca.cert.verify_directly_issued_by(ca.cert)
    lifetime = ca.cert.not_valid_after_utc - ca.cert.not_valid_before_utc
    assert lifetime >= datetime.timedelta(days=3650)


def test_serving_cert_has_exactly_the_service_names(
    ca: certs.KeyPair, serving: certs.KeyPair
) -> None:
    sans = _extension(serving.cert, x509.SubjectAlternativeName).value
    dns_names, ip_addresses = certs.serving_names("subres", "subres-system")
    assert sans.get_values_for_type(x509.DNSName) == dns_names
    assert sans.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address(ip) for ip in ip_addresses
    ]
    assert len(list(sans)) == len(dns_names) + len(ip_addresses)
    assert list(_extension(serving.cert, x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.SERVER_AUTH
    ]
    authority = _extension(serving.cert, x509.AuthorityKeyIdentifier).value
    assert authority.key_identifier == _extension(ca.cert, x509.SubjectKeyIdentifier).value.digest
    assert not _extension(serving.cert, x509.BasicConstraints).value.ca
    serving.cert.verify_directly_issued_by(ca.cert)
    lifetime = serving.cert.not_valid_after_utc - serving.cert.not_valid_before_utc
    assert datetime.timedelta(days=365) <= lifetime < datetime.timedelta(days=366)


def test_client_cert_names_user_and_groups(ca: certs.KeyPair) -> None:
    client = certs.issue_client(ca, user="alice", groups=["dev", "ops"])
    subject = client.cert.subject
    assert [a.value for a in subject.get_attributes_for_oid(NameOID.COMMON_NAME)] == ["alice"]
    assert [a.value for a in subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == [
        "dev",
        "ops",
    ]
    assert list(_extension(client.cert, x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.CLIENT_AUTH
    ]
    client.cert.verify_directly_issued_by(ca.cert)


async def test_serving_cert_verifies_in_a_real_handshake(
    tmp_path: Path, ca: certs.KeyPair, serving: certs.KeyPair
) -> None:
    serving.write(tmp_path / "tls.crt", tmp_path / "tls.key")
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    client_context = ssl.create_default_context(cadata=ca.cert_pem().decode())
    server = await asyncio.start_server(_close, "127.0.0.1", 0, ssl=server_context)
    async with server:
        port = server.sockets[0].getsockname()[1]
        assert await _handshake(port, client_context, SERVICE_HOST) == serving.cert
        with pytest.raises(ssl.SSLCertVerificationError):
            await _handshake(port, client_context, "other.subres-system.svc")


def test_write_replaces_files_with_private_key(tmp_path: Path, ca: certs.KeyPair) -> None:
    cert_path, key_path = tmp_path / "a.crt", tmp_path / "a.key"
    cert_path.write_bytes(b"old")
    key_path.write_bytes(b"old")
    ca.write(cert_path, key_path)
    assert cert_path.read_bytes() == ca.cert_pem()
    assert key_path.read_bytes() == ca.key_pem()
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.crt", "a.key"]


def test_ensure_self_signed_generates_then_reuses(tmp_path: Path) -> None:
    cert_dir = tmp_path / "certs"
    files = certs.ensure_self_signed(cert_dir, service="subres", namespace="subres-system")
    assert files == certs.ServingFiles(
        cert=cert_dir / "apiserver.crt", key=cert_dir / "apiserver.key", ca=cert_dir / "ca.crt"
    )
    assert sorted(p.name for p in cert_dir.iterdir()) == [
        "apiserver.crt",
        "apiserver.key",
        "ca.crt",
        "ca.key",
    ]
    for key in ("apiserver.key", "ca.key"):
        assert stat.S_IMODE((cert_dir / key).stat().st_mode) == 0o600
    serving = x509.load_pem_x509_certificate(files.cert.read_bytes())
    assert files.ca is not None
    serving.verify_directly_issued_by(x509.load_pem_x509_certificate(files.ca.read_bytes()))
    sans = _extension(serving, x509.SubjectAlternativeName).value
    assert SERVICE_HOST in sans.get_values_for_type(x509.DNSName)

    before = {p.name: p.read_bytes() for p in cert_dir.iterdir()}
    again = certs.ensure_self_signed(cert_dir, service="subres", namespace="subres-system")
    assert again == files
    assert {p.name: p.read_bytes() for p in cert_dir.iterdir()} == before


def test_ensure_self_signed_keeps_a_provided_pair_without_ca(
    tmp_path: Path, serving: certs.KeyPair
) -> None:
    serving.write(tmp_path / "apiserver.crt", tmp_path / "apiserver.key")
    files = certs.ensure_self_signed(tmp_path, service="subres", namespace="subres-system")
    assert files.ca is None
    assert files.cert.read_bytes() == serving.cert_pem()


async def _close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.close()


async def _handshake(port: int, context: ssl.SSLContext, server_hostname: str) -> x509.Certificate:
    _, writer = await asyncio.wait_for(
        asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname=server_hostname),
        timeout=5,
    )
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    await asyncio.wait_for(writer.wait_closed(), timeout=5)
    return x509.load_der_x509_certificate(der)
