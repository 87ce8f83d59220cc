"""Endpoints and ports read from real-looking objects: annotations, templates, port strings.

Each test has one shape on purpose: a field of one kind works, then a bad
value of it is refused with a Status before anything is dialed.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import Backend, Standalone, start_standalone

CONSOLE_ANNOTATION = "subres.dev/console"


def parents(sockets: Path) -> list[dict[str, Any]]:
    return [
        {
            "resource": "hosts",
            "kind": "Host",
            "source": {"group": "metal.example", "version": "v1"},
            "subresources": {
                "console": {"endpoint": f'.metadata.annotations["{CONSOLE_ANNOTATION}"]'},
                "vnc": {"endpoint": f"unix://{sockets}/{{.metadata.namespace}}/{{.metadata.name}}"},
                "portforward": {"address": ".status.addresses[type=Internal].address",
                                "ports": ".status.ports"},
            },
        }
    ]  # fmt: skip


def host(name: str, *, annotations: dict[str, str], ports: Any) -> dict[str, Any]:
    return {
        "apiVersion": "metal.example/v1",
        "kind": "Host",
        "metadata": {"name": name, "namespace": "default", "annotations": annotations},
        "status": {
            "addresses": [
                {"type": "External", "address": "192.0.2.1"},
                {"type": "Internal", "address": "127.0.0.1"},
            ],
            "ports": ports,
        },
    }


@pytest.fixture
async def display(tmp_path: Path) -> AsyncIterator[Backend]:
    """An echo server where the vnc template puts host h1's display."""
    (tmp_path / "default").mkdir()
    b = await Backend().start_unix(tmp_path / "default" / "h1")
    yield b
    await b.stop()


@pytest.fixture
async def subres(
    tmp_path: Path, backend: Backend, echo: Backend, display: Backend
) -> AsyncIterator[Standalone]:
    port = int(echo.url.rsplit(":", 1)[1])
    async with start_standalone(
        tmp_path,
        host("h1", annotations={CONSOLE_ANNOTATION: backend.url}, ports=f"22, {port}"),
        host("h2", annotations={}, ports="22,x"),
        host("..", annotations={}, ports=[]),
        config={"group": "consoles.metal.example", "version": "v1", "parents": parents(tmp_path)},
    ) as s:  # fmt: skip
        yield s


async def upgrade(subres: Standalone, path: str) -> None:
    payload = os.urandom(1024)
    assert await subres.echoed(subres.api_url(path), payload) == payload


async def refusal(subres: Standalone, path: str) -> tuple[int, str]:
    code, status = await subres.refused(subres.api_url(path))
    return code, str(status["message"])


async def test_console_endpoint_from_an_annotation_with_dots_and_slashes(
    subres: Standalone, backend: Backend
) -> None:
    await upgrade(subres, "hosts/h1/console")
    assert backend.accepted == 1
    code, body = await refusal(subres, "hosts/h2/console")
    assert code == 400 and 'annotations["subres.dev/console"] is empty' in body


async def test_ports_from_a_string_and_the_address_from_a_matching_list_item(
    subres: Standalone, echo: Backend
) -> None:
    port = int(echo.url.rsplit(":", 1)[1])
    await upgrade(subres, f"hosts/h1/portforward/{port}")
    assert echo.accepted == 1
    code, body = await refusal(subres, "hosts/h1/portforward/23")
    assert code == 403 and "does not allow forwarding to tcp port 23" in body
    code, body = await refusal(subres, "hosts/h2/portforward/22")
    assert code == 400 and "is not a port list" in body and "'x' is not a port" in body


async def test_a_socket_path_built_from_namespace_and_name(
    subres: Standalone, display: Backend
) -> None:
    await upgrade(subres, "hosts/h1/vnc")
    assert display.accepted == 1
    # ".." would name the parent directory of the namespace's sockets: refused, nothing dialed.
    code, body = await refusal(subres, "hosts/%2e%2e/vnc")
    assert code == 400 and "'..' may not go into an endpoint" in body
    assert display.accepted == 1
