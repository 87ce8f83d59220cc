"""ReloadingTLS behind a real aiohttp server: client certificates, ALPN, reloads."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import NameOID

from subres.serving import certs, tls

SERVICE_HOST = "subres.subres-system.svc"
TIMEOUT = 5.0


@dataclass(frozen=True)
class Pki:
    """The files a server reads and the authorities behind them."""

    dir: Path
    ca: certs.KeyPair
    serving: certs.KeyPair
    client_ca: certs.KeyPair
    proxy_ca: certs.KeyPair

    @property
    def cert(self) -> Path:
        return self.dir / "tls.crt"

    @property
    def key(self) -> Path:
        return self.dir / "tls.key"

    @property
    def ca_files(self) -> list[Path]:
        return [self.dir / "client-ca.crt", self.dir / "front-proxy-ca.crt"]


@dataclass(frozen=True)
class Server:
    port: int
    sni: bool
    server_names: list[str | None]
    """The server name of every handshake, as the server saw it."""

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def server_hostname(self) -> str | None:
        return SERVICE_HOST if self.sni else None


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    ca = certs.generate_ca("serving CA")
    pki = Pki(
        dir=tmp_path,
        ca=ca,
        serving=_serving_pair(ca),
        client_ca=certs.generate_ca("client CA"),
        proxy_ca=certs.generate_ca("front-proxy CA"),
    )
    pki.serving.write(pki.cert, pki.key)
    for authority, path in zip((pki.client_ca, pki.proxy_ca), pki.ca_files, strict=True):
        path.write_bytes(authority.cert_pem())
    return pki


@pytest.fixture
def reloading(pki: Pki) -> tls.ReloadingTLS:
    return tls.ReloadingTLS(cert=pki.cert, key=pki.key, client_ca=pki.ca_files)


@pytest.fixture(params=[True, False], ids=["sni", "ip-no-sni"])
async def server(
    request: pytest.FixtureRequest, reloading: tls.ReloadingTLS
) -> AsyncIterator[Server]:
    async with _serve(reloading) as port:
        yield Server(port=port, sni=request.param, server_names=_record_server_names(reloading))


def _serving_pair(ca: certs.KeyPair) -> certs.KeyPair:
    dns_names, ip_addresses = certs.serving_names("subres", "subres-system")
    return certs.issue_serving(
        ca, common_name=SERVICE_HOST, dns_names=dns_names, ip_addresses=ip_addresses
    )


def _record_server_names(reloading: tls.ReloadingTLS) -> list[str | None]:
    names: list[str | None] = []
    select = reloading.context.sni_callback
    assert select is not None

    def record(ssl_object: ssl.SSLObject, name: str | None, context: ssl.SSLContext) -> int | None:
        names.append(name)
        return select(ssl_object, name, context)  # type: ignore[arg-type]

    reloading.context.sni_callback = record
    return names


@asynccontextmanager
async def _serve(reloading: tls.ReloadingTLS) -> AsyncIterator[int]:
    app = web.Application()
    app.router.add_get("/whoami", _whoami)
    app.router.add_get("/ws", _echo)
    runner = web.AppRunner(app, shutdown_timeout=TIMEOUT)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=reloading.context).start()
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()


async def _whoami(request: web.Request) -> web.Response:
    cert = tls.peer_certificate(request.transport)
    assert request.transport is not None
    _, port = request.transport.get_extra_info("peername")
    return web.json_response({"cn": None if cert is None else _common_name(cert), "port": port})


async def _echo(request: web.Request) -> web.WebSocketResponse:
    ws = web.WebSocketResponse()
    await ws.prepare(request)
    async for message in ws:
        await ws.send_str(message.data)
    return ws


def _common_name(cert: x509.Certificate) -> str:
    return str(cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)


def _client_context(
    tmp_path: Path, *, trust: certs.KeyPair, identity: certs.KeyPair | None = None
) -> ssl.SSLContext:
    context = ssl.create_default_context(cadata=trust.cert_pem().decode())
    if identity is not None:
        stem = tmp_path / f"client-{identity.cert.serial_number:x}"
        identity.write(stem.with_suffix(".crt"), stem.with_suffix(".key"))
        context.load_cert_chain(stem.with_suffix(".crt"), stem.with_suffix(".key"))
    return context


@asynccontextmanager
async def _session(context: ssl.SSLContext) -> AsyncIterator[aiohttp.ClientSession]:
    connector = aiohttp.TCPConnector(ssl=context, limit=1)
    timeout = aiohttp.ClientTimeout(total=TIMEOUT)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        yield session


async def _whoami_via(session: aiohttp.ClientSession, server: Server) -> dict[str, Any]:
    async with session.get(
        f"{server.url}/whoami", server_hostname=server.server_hostname
    ) as response:
        response.raise_for_status()
        body: dict[str, Any] = await response.json()
        return body


async def _handshake(
    server: Server, context: ssl.SSLContext
) -> tuple[x509.Certificate, str | None]:
    """The certificate the server presents to a new connection, and the ALPN protocol."""
    _, writer = await asyncio.wait_for(
        asyncio.open_connection(
            "127.0.0.1", server.port, ssl=context, server_hostname=server.server_hostname
        ),
        timeout=TIMEOUT,
    )
    ssl_object = writer.get_extra_info("ssl_object")
    der, protocol = ssl_object.getpeercert(binary_form=True), ssl_object.selected_alpn_protocol()
    writer.close()
    await asyncio.wait_for(writer.wait_closed(), timeout=TIMEOUT)
    return x509.load_der_x509_certificate(der), protocol


def _expected_names(server: Server, count: int) -> list[str | None]:
    # Python's ssl sends no SNI for an IP address, so the server sees None.
    return [server.server_hostname] * count


async def test_client_certificates_from_each_ca_are_seen(
    tmp_path: Path, pki: Pki, server: Server
) -> None:
    for authority, user in ((pki.client_ca, "alice"), (pki.proxy_ca, "front-proxy-client")):
        identity = certs.issue_client(authority, user=user, groups=["dev"])
        async with _session(_client_context(tmp_path, trust=pki.ca, identity=identity)) as session:
            assert (await _whoami_via(session, server))["cn"] == user
    assert server.server_names == _expected_names(server, 2)


async def test_client_without_certificate_connects(
    tmp_path: Path, pki: Pki, server: Server
) -> None:
    async with _session(_client_context(tmp_path, trust=pki.ca)) as session:
        assert (await _whoami_via(session, server))["cn"] is None
    assert server.server_names == _expected_names(server, 1)


async def test_client_certificate_from_unknown_ca_is_refused(
    tmp_path: Path, pki: Pki, server: Server
) -> None:
    stranger = certs.issue_client(certs.generate_ca("stranger CA"), user="mallory", groups=[])
    context = _client_context(tmp_path, trust=pki.ca, identity=stranger)
    async with _session(context) as session:
        with pytest.raises(aiohttp.ClientError):
            await _whoami_via(session, server)


async def test_only_http11_is_negotiated(pki: Pki, server: Server) -> None:
    for offered, selected in ((["h2", "http/1.1"], "http/1.1"), (["h2"], None)):
        context = ssl.create_default_context(cadata=pki.ca.cert_pem().decode())
        context.set_alpn_protocols(offered)
        assert (await _handshake(server, context))[1] == selected
    assert server.server_names == _expected_names(server, 2)


async def test_tls12_is_the_minimum(pki: Pki, reloading: tls.ReloadingTLS, server: Server) -> None:
    context = ssl.create_default_context(cadata=pki.ca.cert_pem().decode())
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    assert (await _handshake(server, context))[0] == pki.serving.cert
    assert reloading.context.minimum_version == ssl.TLSVersion.TLSv1_2


async def test_reload_serves_new_connections_and_keeps_live_ones(
    tmp_path: Path, pki: Pki, reloading: tls.ReloadingTLS, server: Server
) -> None:
    alice = certs.issue_client(pki.client_ca, user="alice", groups=[])
    old_trust = _client_context(tmp_path, trust=pki.ca, identity=alice)
    async with _session(old_trust) as keep_alive, _session(old_trust) as websocket:
        before = await _whoami_via(keep_alive, server)
        ws_url = f"{server.url}/ws"
        async with websocket.ws_connect(ws_url, server_hostname=server.server_hostname) as ws:
            await ws.send_str("before")
            assert await ws.receive_str(timeout=TIMEOUT) == "before"

            new_ca = certs.generate_ca("rotated serving CA")
            new_serving = _serving_pair(new_ca)
            new_serving.write(pki.cert, pki.key)
            assert reloading.reload_if_changed()

            new_trust = _client_context(tmp_path, trust=new_ca, identity=alice)
            assert (await _handshake(server, new_trust))[0] == new_serving.cert
            with pytest.raises(ssl.SSLCertVerificationError):
                await _handshake(server, _client_context(tmp_path, trust=pki.ca))

            await ws.send_str("after")
            assert await ws.receive_str(timeout=TIMEOUT) == "after"
            # Same client port: the pooled connection, which still trusts the old serving CA.
            assert await _whoami_via(keep_alive, server) == before
    async with _session(new_trust) as session:
        assert (await _whoami_via(session, server))["cn"] == "alice"
    assert server.server_names == _expected_names(server, 5)


async def test_unchanged_files_are_not_reloaded(reloading: tls.ReloadingTLS) -> None:
    assert reloading.ready
    assert not reloading.reload_if_changed()


@pytest.fixture(
    params=["truncated-cert", "garbage-key", "mismatched-key", "encrypted-key", "empty-client-ca"]
)
def breakage(request: pytest.FixtureRequest, pki: Pki) -> Iterator[None]:
    other = _serving_pair(pki.ca)
    if request.param == "truncated-cert":
        pki.cert.write_bytes(other.cert_pem()[:200])
    elif request.param == "garbage-key":
        pki.key.write_bytes(b"-----BEGIN PRIVATE KEY-----\nnot a key\n")
    elif request.param == "mismatched-key":
        pki.key.write_bytes(other.key_pem())
    elif request.param == "encrypted-key":
        encryption = serialization.BestAvailableEncryption(b"secret")
        pem = serialization.PrivateFormat.PKCS8
        pki.key.write_bytes(
            pki.serving.key.private_bytes(serialization.Encoding.PEM, pem, encryption)
        )
    else:
        pki.ca_files[0].write_bytes(b"")
    yield


async def test_broken_files_keep_the_previous_context(
    pki: Pki,
    reloading: tls.ReloadingTLS,
    server: Server,
    breakage: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger=tls.__name__):
        assert not reloading.reload_if_changed()
        assert not reloading.reload_if_changed()
    assert len(caplog.records) == 1
    assert reloading.ready
    trust = ssl.create_default_context(cadata=pki.ca.cert_pem().decode())
    assert (await _handshake(server, trust))[0] == pki.serving.cert

    repaired = _serving_pair(pki.ca)
    repaired.write(pki.cert, pki.key)
    pki.ca_files[0].write_bytes(pki.client_ca.cert_pem())
    assert reloading.reload_if_changed()
    assert (await _handshake(server, trust))[0] == repaired.cert


async def test_not_ready_until_the_files_appear(tmp_path: Path) -> None:
    cert, key = tmp_path / "later.crt", tmp_path / "later.key"
    reloading = tls.ReloadingTLS(cert=cert, key=key)
    assert not reloading.ready
    ca = certs.generate_ca("late CA")
    trust = ssl.create_default_context(cadata=ca.cert_pem().decode())
    async with _serve(reloading) as port:
        server = Server(port=port, sni=True, server_names=[])
        # The server aborts the handshake; the client sees an alert or a reset.
        with pytest.raises(OSError):
            await _handshake(server, trust)
        serving = _serving_pair(ca)
        serving.write(cert, key)
        assert reloading.reload_if_changed()
        assert reloading.ready
        assert (await _handshake(server, trust))[0] == serving.cert


async def test_client_ca_files_are_reloaded_too(
    tmp_path: Path, pki: Pki, reloading: tls.ReloadingTLS, server: Server
) -> None:
    old_user = certs.issue_client(pki.client_ca, user="old", groups=[])
    new_ca = certs.generate_ca("rotated client CA")
    new_user = certs.issue_client(new_ca, user="new", groups=[])
    pki.ca_files[0].write_bytes(new_ca.cert_pem())
    assert reloading.reload_if_changed()

    async with _session(_client_context(tmp_path, trust=pki.ca, identity=new_user)) as session:
        assert (await _whoami_via(session, server))["cn"] == "new"
    async with _session(_client_context(tmp_path, trust=pki.ca, identity=old_user)) as session:
        with pytest.raises(aiohttp.ClientError):
            await _whoami_via(session, server)


async def test_watch_reloads_in_the_background(
    pki: Pki, reloading: tls.ReloadingTLS, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop = asyncio.get_running_loop()
    reloaded = asyncio.Event()
    reload_if_changed = reloading.reload_if_changed

    def reload_and_tell() -> bool:
        changed = reload_if_changed()
        if changed:
            loop.call_soon_threadsafe(reloaded.set)
        return changed

    monkeypatch.setattr(reloading, "reload_if_changed", reload_and_tell)
    watcher = asyncio.create_task(reloading.watch(interval=0.01))
    try:
        _serving_pair(pki.ca).write(pki.cert, pki.key)
        await asyncio.wait_for(reloaded.wait(), timeout=TIMEOUT)
    finally:
        watcher.cancel()
        with pytest.raises(asyncio.CancelledError):
            await watcher


def test_peer_certificate_without_tls() -> None:
    assert tls.peer_certificate(None) is None
    assert tls.peer_certificate(asyncio.Transport(extra={"peername": ("127.0.0.1", 1)})) is None
