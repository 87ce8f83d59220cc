"""The known vulnerability classes of aggregated and streaming servers, tried at subres's door.

- CVE-2018-1002105: a proxy kept a connection whose upgrade failed and let
  its client go on writing, with the proxy's own credentials. subres closes
  every connection whose upgrade it refused, so nothing more is read there.
- CVE-2020-8559 / CVE-2022-3172: a proxy followed, or handed its client, a
  redirect the backend chose. subres answers no redirect anywhere
  kube-apiserver proxies to it (and only `/ui` → `/ui/`, a relative path, on
  its own page).
- CVE-2025-64432's class: a front-proxy certificate from the right CA but a
  name outside `requestheader-allowed-names` is not a proxy, in any spelling
  (one common name, or an allowed one beside another).

The same classes through a real kube-apiserver are in `tests/e2e/test_cves.py`.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import os
import re
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from subres.serving import certs
from tests.server.test_cluster import CLIENT_CA, CONSOLE, PROXY_CA, client_ssl, cluster, get
from tests.support import GROUP_VERSION, Backend, Standalone, machine, start_standalone, wait_for

WAIT = 10.0


def upgrade_request(path: str, *, spdy: bool = False, **headers: str) -> bytes:
    lines = [f"GET {path} HTTP/1.1", "Host: subres"]
    if spdy:
        lines += [
            "Connection: Upgrade",
            "Upgrade: SPDY/3.1",
            "X-Stream-Protocol-Version: v4.channel.k8s.io",
        ]
    else:
        key = base64.b64encode(os.urandom(16)).decode()
        lines += ["Connection: Upgrade", "Upgrade: websocket", f"Sec-WebSocket-Key: {key}"]
        lines += ["Sec-WebSocket-Version: 13"]
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One HTTP answer: its code and its head."""
    async with asyncio.timeout(WAIT):
        head = await reader.readuntil(b"\r\n\r\n")
        length = re.search(rb"(?i)content-length: (\d+)", head)
        if length:
            await reader.readexactly(int(length.group(1)))
    return int(head.split(b" ", 2)[1]), head


async def closed(reader: asyncio.StreamReader) -> bool:
    """Whether the server closes the connection (EOF or reset) rather than answering."""
    try:
        async with asyncio.timeout(WAIT):
            return await reader.read(1) == b""
    except (ConnectionError, ssl.SSLError):
        return True


# -- CVE-2018-1002105 -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "spdy", "user", "code"),
    [
        (CONSOLE, False, "bob", 403),  # the SubjectAccessReview says no
        (CONSOLE.replace("/vm/", "/none/"), False, "alice", 404),
        (CONSOLE, True, "bob", 403),  # a SPDY upgrade, refused alike
        (CONSOLE.replace("console", "portforward"), False, "alice", 400),  # no ?ports=
    ],
)
async def test_a_refused_upgrade_closes_the_proxys_connection(
    tmp_path: Path, path: str, spdy: bool, user: str, code: int
) -> None:
    backend = await Backend().start_tcp()
    try:
        async with cluster(tmp_path) as (fake, server):
            await fake.put(machine("vm", console=backend.url))
            await wait_for(lambda: server.state.caches["machines"].get("default", "vm") is not None)
            fake.allow = lambda spec: spec["user"] == "alice"
            proxy = certs.issue_client(PROXY_CA, user="front-proxy-client", groups=[])
            reader, writer = await asyncio.open_connection(
                "127.0.0.1",
                server.port,
                ssl=client_ssl(tmp_path, proxy),
                server_hostname="localhost",
            )
            try:
                writer.write(upgrade_request(path, spdy=spdy, X_Remote_User=user))
                status, head = await answer(reader)
                assert status == code and b"Connection: close" in head, head
                # What a proxy would pass on next: a request of the attacker's choosing.
                writer.write(upgrade_request(CONSOLE, X_Remote_User="alice"))
                assert await closed(reader)
            finally:
                writer.close()
            assert backend.accepted == 0
            assert all(spec["user"] == user for spec in fake.sar_specs), fake.sar_specs
    finally:
        await backend.stop()


async def test_an_answered_plain_request_keeps_its_connection(tmp_path: Path) -> None:
    # The control: keep-alive still works where no upgrade was asked for.
    async with cluster(tmp_path) as (fake, server):
        fake.allow = lambda spec: True
        proxy = certs.issue_client(PROXY_CA, user="front-proxy-client", groups=[])
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", server.port, ssl=client_ssl(tmp_path, proxy), server_hostname="localhost"
        )
        try:
            for _ in range(2):
                request = f"GET /apis/{GROUP_VERSION}/nosuch HTTP/1.1\r\nHost: s\r\n"
                writer.write(f"{request}X-Remote-User: alice\r\n\r\n".encode())
                status, head = await answer(reader)
                assert status == 404 and b"Connection: close" not in head
        finally:
            writer.close()


# -- CVE-2020-8559 / CVE-2022-3172 ------------------------------------------------------


PLACEHOLDERS = {
    "namespace": "default",
    "resource": "machines",
    "name": "vm1",
    "file": "20240101T000000Z-00000000.cast",
    "port": "22",
    "protocol": "tcp",
    "check": "ping",
    "path": "x",
}


async def test_no_route_answers_a_redirect_kube_apiserver_would_follow_or_forward(
    tmp_path: Path,
) -> None:
    backend = await Backend().start_tcp()
    try:
        async with start_standalone(tmp_path, machine("vm1", console=backend.url)) as subres:
            answers = await _every_route(subres)
    finally:
        await backend.stop()
    redirects = {key: head for key, (status, head) in answers.items() if 300 <= status < 400}
    # The page's own trailing slash, relative, outside every path kube-apiserver proxies.
    assert set(redirects) == {("GET", "/ui", "plain")}, redirects
    assert re.search(rb"(?i)\r\nlocation: /ui/\r\n", redirects["GET", "/ui", "plain"])
    assert len(answers) > 60  # every route, in every way of asking


async def _every_route(subres: Standalone) -> dict[tuple[str, str, str], tuple[int, bytes]]:
    answers = {}
    assert subres.server.runner is not None
    for route in subres.server.runner.app.router.routes():
        info = route.resource.get_info() if route.resource else {}
        template = info.get("formatter") or info.get("path") or info.get("prefix")
        if not template or route.method not in ("GET", "POST"):
            continue
        path = template.format(**PLACEHOLDERS)
        for how in ("plain", "websocket", "spdy"):
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", subres.server.port, ssl=subres.client_ssl, server_hostname="localhost"
            )
            try:
                request = _request(route.method, path, how, token=subres.token)
                writer.write(request)
                answers[route.method, path, how] = await answer(reader)
            finally:
                writer.close()
    return answers


def _request(method: str, path: str, how: str, *, token: str) -> bytes:
    if how == "plain":
        text = f"{method} {path} HTTP/1.1\r\nHost: s\r\nAuthorization: Bearer {token}\r\n\r\n"
        return text.encode()
    request = upgrade_request(path, spdy=how == "spdy", Authorization=f"Bearer {token}")
    return request.replace(b"GET ", f"{method} ".encode(), 1)


async def test_an_old_openapi_hash_is_the_document_not_a_redirect(tmp_path: Path) -> None:
    async with start_standalone(tmp_path) as subres:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", subres.server.port, ssl=subres.client_ssl, server_hostname="localhost"
        )
        try:
            path = f"/openapi/v3/apis/{GROUP_VERSION}?hash=0123"
            writer.write(_request("GET", path, "plain", token=subres.token))
            status, head = await answer(reader)
        finally:
            writer.close()
    assert status == 200 and b"no-cache, private" in head and b"Location" not in head


# -- CVE-2025-64432 ---------------------------------------------------------------------


def proxy_certificate(ca: certs.KeyPair, *common_names: str) -> certs.KeyPair:
    """A client certificate of `ca` whose subject has each of `common_names`, in order."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn) for cn in common_names])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca.key, hashes.SHA256())
    )
    return certs.KeyPair(cert, key)


def certificate_without_usages(ca: certs.KeyPair, common_name: str) -> certs.KeyPair:
    """A certificate of `ca` named `common_name` with no ExtendedKeyUsage extension at all."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .sign(ca.key, hashes.SHA256())
    )
    return certs.KeyPair(cert, key)


@pytest.mark.parametrize(
    "names",
    [("intruder",), ("front-proxy-client", "intruder"), ("intruder", "front-proxy-client")],
)
async def test_a_proxy_certificate_of_the_right_ca_with_another_name_is_no_proxy(
    tmp_path: Path, names: tuple[str, ...]
) -> None:
    async with cluster(tmp_path) as (fake, server):
        fake.allow = lambda spec: True
        ctx = client_ssl(tmp_path, proxy_certificate(PROXY_CA, *names))
        status, body = await get(server, f"/apis/{GROUP_VERSION}", ctx, X_Remote_User="admin")
        assert (status, body["reason"]) == (401, "Unauthorized")
        assert all(spec["user"] != "admin" for spec in fake.sar_specs)


async def test_the_right_name_from_the_wrong_ca_is_a_user_not_a_proxy(tmp_path: Path) -> None:
    async with cluster(tmp_path) as (fake, server):
        fake.allow = lambda spec: True
        ctx = client_ssl(tmp_path, proxy_certificate(CLIENT_CA, "front-proxy-client"))
        status, _ = await get(server, f"/apis/{GROUP_VERSION}", ctx, X_Remote_User="admin")
        assert status == 200
        assert fake.sar_specs[-1]["user"] == "front-proxy-client"  # its own name; no header
        good = client_ssl(tmp_path, proxy_certificate(PROXY_CA, "front-proxy-client"))
        status, _ = await get(server, f"/apis/{GROUP_VERSION}", good, X_Remote_User="alice")
        assert status == 200 and fake.sar_specs[-1]["user"] == "alice"
