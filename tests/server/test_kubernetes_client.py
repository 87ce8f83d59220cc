"""The `kubernetes` Python client's WebSocket stream client against the console."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kubernetes import config as kubeconfig
from kubernetes.stream.ws_client import WSClient

from tests.support import Backend, Standalone, machine, start_standalone


@pytest.fixture
async def subres(tmp_path: Path) -> AsyncIterator[Standalone]:
    backend = await Backend().start_tcp()
    try:
        async with start_standalone(tmp_path, machine("vm1", console=backend.url)) as s:
            yield s
    finally:
        await backend.stop()


def session(subres: Standalone, payload: str) -> tuple[str, int | None, str | None]:
    """Send `payload`, close stdin (v5), read until the server closes: output, exit, protocol."""
    api = kubeconfig.new_client_from_config(config_file=str(subres.kubeconfig()))
    configuration = api.configuration
    headers = {"authorization": configuration.get_api_key_with_prefix("BearerToken")}
    client = WSClient(configuration, subres.url("vm1"), headers, capture_all=True)
    try:
        client.write_channel(0, payload)
        client.close_channel(0)
        client.run_forever(timeout=20)
        # returncode reads the error channel; read_all() would discard it.
        returncode = client.returncode
        return client.read_all(), returncode, client.subprotocol
    finally:
        client.close()
        api.close()


async def test_stream_client_round_trip_and_success_status(subres: Standalone) -> None:
    payload = os.urandom(200_000).hex()
    output, returncode, protocol = await asyncio.to_thread(session, subres, payload)
    assert protocol == "v5.channel.k8s.io"
    assert (
        hashlib.sha256(output.encode()).hexdigest() == hashlib.sha256(payload.encode()).hexdigest()
    )
    assert returncode == 0
