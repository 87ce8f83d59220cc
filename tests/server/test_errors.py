"""Every refusal is a Kubernetes Status with the right code, and costs no backend connection."""

from __future__ import annotations

import base64
import json
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import websockets
from aiohttp import web
from websockets.asyncio.client import connect

from subres.server import sessionlist
from subres.serving import certs
from tests.support import Backend, Standalone, machine, start_standalone


@pytest.fixture
async def subres(tmp_path: Path, backend: Backend) -> AsyncIterator[Standalone]:
    async with start_standalone(
        tmp_path,
        machine("vm1", console=backend.url),
        machine("stopped", console=backend.url, phase="Stopped"),
        machine("headless"),
        machine("dead", console="tcp://127.0.0.1:1"),
        machine("metadata", console="tcp://169.254.169.254:80"),
        machine("elsewhere", console="unix:///etc/passwd"),
        machine("garbled", console="http://example"),
    ) as s:
        yield s


async def refused(
    subres: Standalone,
    name: str,
    *,
    headers: dict[str, str] | None = None,
    protocols: list[str] | None = None,
) -> tuple[int, dict[str, Any]]:
    """Try a console upgrade; the HTTP status and Status body of the refusal."""
    with pytest.raises(websockets.InvalidStatus) as info:
        async with connect(
            subres.url(name),
            ssl=subres.client_ssl,
            additional_headers=subres.auth if headers is None else headers,
            subprotocols=[websockets.Subprotocol(p) for p in protocols or []] or None,
            open_timeout=10,
        ):
            pass
    response = info.value.response
    return response.status_code, json.loads(response.body or b"{}")


@pytest.mark.parametrize(
    ("name", "code", "words"),
    [
        ("nosuch", 404, 'machines.subres.dev "nosuch" not found'),
        ("stopped", 409, '"Stopped"'),
        ("headless", 400, "has no console"),
        ("dead", 503, "cannot connect to tcp://127.0.0.1:1"),
        ("metadata", 403, "169.254.169.254 is not allowed"),
        ("elsewhere", 403, "outside the allowed directories"),
        ("garbled", 400, "unsupported endpoint scheme"),
    ],
)
async def test_machine_errors(
    subres: Standalone, backend: Backend, name: str, code: int, words: str
) -> None:
    status, body = await refused(subres, name)
    assert status == code
    assert body["kind"] == "Status" and body["code"] == code and body["status"] == "Failure"
    assert words in body["message"]
    assert backend.accepted == 0


async def test_unsupported_subprotocols_listed(subres: Standalone, backend: Backend) -> None:
    status, body = await refused(subres, "vm1", protocols=["v99.nonsense", "mqtt"])
    assert status == 400
    assert "v5.channel.k8s.io" in body["message"] and "plain.kubevirt.io" in body["message"]
    assert backend.accepted == 0


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic YWxpY2U6eA=="}],
)
async def test_unauthenticated_gets_401_and_no_backend(
    subres: Standalone, backend: Backend, headers: dict[str, str]
) -> None:
    status, body = await refused(subres, "vm1", headers=headers)
    assert (status, body["reason"]) == (401, "Unauthorized")
    assert backend.accepted == 0


async def test_bearer_subprotocol_authenticates(subres: Standalone) -> None:
    encoded = base64.urlsafe_b64encode(subres.token.encode()).decode().rstrip("=")
    async with connect(
        subres.url("vm1"),
        ssl=subres.client_ssl,
        subprotocols=[
            websockets.Subprotocol(f"base64url.bearer.authorization.k8s.io.{encoded}"),
            websockets.Subprotocol("v4.channel.k8s.io"),
        ],
    ) as ws:
        assert ws.subprotocol == "v4.channel.k8s.io"
        assert await ws.recv() == b"\x01"


async def test_client_certificate_authenticates(subres: Standalone) -> None:
    ctx = subres.client_cert_ssl("carol", ["admins"])
    async with connect(subres.url("vm1"), ssl=ctx) as ws:
        await ws.send(b"ping")
        assert await ws.recv() == b"ping"


async def test_certificate_from_another_ca_is_not_an_identity(
    subres: Standalone, tmp_path: Path
) -> None:
    rogue = certs.generate_ca("rogue")
    pair = certs.issue_client(rogue, user="mallory", groups=["system:masters"])
    pair.write(tmp_path / "m.crt", tmp_path / "m.key")
    ctx = subres.client_cert_ssl("unused", [])
    ctx.load_cert_chain(tmp_path / "m.crt", tmp_path / "m.key")
    # The TLS layer refuses a certificate that no trusted CA issued.
    with pytest.raises((OSError, websockets.InvalidHandshake)):
        async with connect(subres.url("vm1"), ssl=ctx, open_timeout=5):
            pass


async def test_hanging_backend_answers_503_within_the_connect_timeout(tmp_path: Path) -> None:
    # A TCP listener that never accepts and whose accept queue is full drops new SYNs:
    # connect() hangs, as it does for a firewalled backend.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    address = listener.getsockname()
    fillers = []
    try:
        for _ in range(16):
            filler = socket.socket()
            filler.settimeout(0.3)
            fillers.append(filler)
            try:
                filler.connect(address)
            except TimeoutError:
                break
        else:
            pytest.fail("the accept queue never filled up")
        async with start_standalone(
            tmp_path,
            machine("slow", console=f"tcp://127.0.0.1:{address[1]}"),
            session={"connectTimeout": 0.5},
        ) as subres:
            started = time.monotonic()
            status, body = await refused(subres, "slow")
            elapsed = time.monotonic() - started
    finally:
        for filler in fillers:
            filler.close()
        listener.close()
    assert status == 503
    assert "timed out after 0.5s" in body["message"]
    assert elapsed < 3


async def test_unknown_paths_and_methods_are_status(subres: Standalone) -> None:
    async with aiohttp.ClientSession(headers=subres.auth) as http:
        async with http.get(f"{subres.base}/apis/nope/v1", ssl=subres.client_ssl) as r:
            body = await r.json()
            assert (r.status, body["kind"], body["code"]) == (404, "Status", 404)
        url = subres.url("vm1", scheme="https")
        async with http.delete(url, ssl=subres.client_ssl) as r:
            body = await r.json()
            assert (r.status, body["code"]) == (405, 405)
        async with http.get(url, ssl=subres.client_ssl) as r:
            body = await r.json()
            assert r.status == 400 and "WebSocket upgrade" in body["message"]
        url = subres.url("vm1", "frobnicate", scheme="https")
        async with http.get(url, ssl=subres.client_ssl) as r:
            assert r.status == 404


async def test_machine_changes_apply_without_restart(subres: Standalone, backend: Backend) -> None:
    subres.write_machines(machine("fresh", console=backend.url))
    async with connect(subres.url("fresh"), ssl=subres.client_ssl, additional_headers=subres.auth):
        pass
    status, _ = await refused(subres, "vm1")
    assert status == 404
    await backend.wait_open(0)


async def test_a_failure_nobody_expected_is_a_500_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(*_: object) -> web.Response:
        raise RuntimeError("a bug")

    monkeypatch.setattr(sessionlist, "for_namespace", broken)
    async with (
        start_standalone(tmp_path) as subres,
        aiohttp.ClientSession() as http,
        http.get(
            subres.api_url("sessions", scheme="https"), headers=subres.auth, ssl=subres.client_ssl
        ) as r,
    ):
        body = await r.json()
        assert (r.status, body["kind"], body["code"]) == (500, "Status", 500)
        assert body["message"] == "an internal error occurred"  # never the traceback
        assert r.headers["Connection"] == "close"
