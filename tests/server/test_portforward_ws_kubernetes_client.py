"""The `kubernetes` Python client's WebSocket port-forward (`portforward_call`) against ours."""

# The official `kubernetes` client is untyped; this test drives it as a real peer.
# mypy: disable-error-code="no-untyped-call"

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kubernetes import config as kubeconfig
from kubernetes.stream.ws_client import portforward_call

from tests.server.portforward_support import pf_machine, port_of, sha_on_eof
from tests.support import Backend, Standalone, start_standalone

SIZE = 8 << 20
"""The client moves bytes through a thread, a socketpair and select(): slow, so fewer bytes."""


@pytest.fixture
async def backends() -> AsyncIterator[tuple[Backend, Backend]]:
    echo = await Backend().start_tcp()
    summer = await Backend(handler=sha_on_eof).start_tcp()
    yield echo, summer
    await echo.stop()
    await summer.stop()


@pytest.fixture
async def subres(tmp_path: Path, backends: tuple[Backend, Backend]) -> AsyncIterator[Standalone]:
    ports = [port_of(b.url) for b in backends]
    async with start_standalone(tmp_path, pf_machine("vm1", ports)) as s:
        yield s


def _echo_through(sock: socket.socket, payload: bytes) -> str:
    h = hashlib.sha256()
    got = 0
    sock.settimeout(20)
    view = memoryview(payload)
    sent = 0
    while got < len(payload):
        if sent < len(payload):
            sent += sock.send(view[sent : sent + 65536])
        data = sock.recv(1 << 20)
        assert data, "the forwarded connection ended early"
        h.update(data)
        got += len(data)
    return h.hexdigest()


def forward(subres: Standalone, echo_port: int, other_port: int) -> tuple[str, str | None]:
    """Echo `SIZE` bytes through one port; returns their hash and the other port's error."""
    api = kubeconfig.new_client_from_config(config_file=str(subres.kubeconfig()))
    configuration = api.configuration
    headers = {"authorization": configuration.get_api_key_with_prefix("BearerToken")}
    url = subres.url("vm1", f"portforward?ports={echo_port},{other_port}", scheme="https")
    pf = portforward_call(configuration, "GET", url, headers=headers)
    try:
        payload = os.urandom(SIZE)
        digest = _echo_through(pf.socket(echo_port), payload)
        assert digest == hashlib.sha256(payload).hexdigest()
        return digest, pf.error(echo_port)
    finally:
        pf.close()
        api.close()


async def test_kubernetes_client_round_trip_hashed(
    subres: Standalone, backends: tuple[Backend, Backend]
) -> None:
    echo, summer = backends
    digest, error = await asyncio.to_thread(forward, subres, port_of(echo.url), port_of(summer.url))
    assert len(digest) == 64
    assert error is None
    await echo.wait_open(0)
