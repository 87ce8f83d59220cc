"""A Machine editor tries to make subres dial what the policy forbids, through the server.

The listener the policy denies really exists on 127.0.0.2; every attempt must
be refused with a Status before any connection reaches it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import websockets
from websockets.asyncio.client import connect

from tests.server.portforward_support import pf_machine, port_of
from tests.support import Backend, Standalone, machine, start_standalone

# Everything but 127.0.0.2, in both families: the IPv6 rule is what the
# IPv4-mapped spellings used to slip through.
POLICY = {"allowCIDRs": ["127.0.0.0/8", "::/0"], "denyCIDRs": ["127.0.0.2/32"]}


@pytest.fixture
async def denied() -> AsyncIterator[Backend]:
    """A listener the policy denies, counting whoever reaches it."""
    b = await Backend().start_tcp("127.0.0.2")
    yield b
    await b.stop()


async def refusal(subres: Standalone, name: str, path: str) -> tuple[int, dict[str, Any]]:
    """Try a WebSocket upgrade of `path` on machine `name`; the status and Status body."""
    with pytest.raises(websockets.InvalidStatus) as info:
        async with connect(
            subres.url(name, path),
            ssl=subres.client_ssl,
            additional_headers=subres.auth,
            # The channel port-forward needs a channel subprotocol; the others take none.
            subprotocols=[websockets.Subprotocol("v4.channel.k8s.io")] if "?" in path else None,
            open_timeout=10,
        ):
            pass
    response = info.value.response
    assert response.headers["Content-Type"].startswith("application/json")
    return response.status_code, json.loads(response.body or b"{}")


def forward(name: str, address: str, ports: list[Any]) -> dict[str, Any]:
    """A Machine whose port-forward goes to `address`."""
    obj = pf_machine(name, [])
    obj["status"]["portForward"] = {"address": address, "ports": ports}
    return obj


MAPPED = ["::ffff:127.0.0.2", "::ffff:7f00:2", "0:0:0:0:0:ffff:127.0.0.2"]


async def test_ipv4_mapped_spellings_do_not_reach_a_denied_listener(
    tmp_path: Path, denied: Backend
) -> None:
    port = port_of(denied.url)
    objects = [machine(f"c{i}", console=f"tcp://[{a}]:{port}") for i, a in enumerate(MAPPED)]
    objects += [forward(f"f{i}", a, [port]) for i, a in enumerate(MAPPED)]
    async with start_standalone(tmp_path, *objects, policy=POLICY) as subres:
        for i in range(len(MAPPED)):
            for name, path in (
                (f"c{i}", "console"),
                (f"f{i}", f"portforward?ports={port}"),
                (f"f{i}", f"portforward/{port}"),
            ):
                status, body = await refusal(subres, name, path)
                assert (status, body["code"]) == (403, 403), (name, path, body)
                assert "(that is 127.0.0.2) is not allowed" in body["message"]
    assert denied.accepted == 0


async def test_symlinked_socket_outside_the_allowed_dir_is_refused(tmp_path: Path) -> None:
    allowed, outside = tmp_path / "sockets", tmp_path / "outside"
    allowed.mkdir()
    outside.mkdir()
    runtime = await Backend().start_unix(outside / "runtime.sock")
    (allowed / "vm.sock").symlink_to(outside / "runtime.sock")
    policy = {"socketDirs": [str(allowed)]}
    try:
        obj = machine("vm", console=f"unix://{allowed / 'vm.sock'}")
        async with start_standalone(tmp_path, obj, policy=policy) as subres:
            status, body = await refusal(subres, "vm", "console")
    finally:
        await runtime.stop()
    assert status == 403 and "outside the allowed directories" in body["message"]
    assert runtime.accepted == 0


@pytest.mark.parametrize("address", ["[junk", "127.0.0.1]:1", "a b", "host/x", "::1::2"])
async def test_unparseable_forward_address_is_a_400_status(tmp_path: Path, address: str) -> None:
    async with start_standalone(tmp_path, forward("vm", address, [22])) as subres:
        for path in ("portforward?ports=22", "portforward/22"):
            status, body = await refusal(subres, "vm", path)
            assert (status, body["kind"], body["code"]) == (400, "Status", 400)
            assert ".status.portForward.address" in body["message"]


@pytest.mark.parametrize("url", ["tcp://[junk:22", "tcp://127.0.0.1]:1:22", "tcp://h:1/x"])
async def test_unparseable_console_endpoint_is_a_400_status(tmp_path: Path, url: str) -> None:
    async with start_standalone(tmp_path, machine("vm", console=url)) as subres:
        status, body = await refusal(subres, "vm", "console")
    assert (status, body["code"]) == (400, 400)


@pytest.mark.parametrize("ports", [[True], [1.0], [0], [70000], {"1": 1}, "1,x"])
async def test_ports_that_are_not_port_numbers_are_refused(
    tmp_path: Path, ports: Any, echo: Backend
) -> None:
    # `true` must not be read as port 1 (nor a float, string or out-of-range number).
    async with start_standalone(tmp_path, forward("vm", "127.0.0.1", ports)) as subres:
        for path in ("portforward?ports=1", "portforward/1"):
            status, body = await refusal(subres, "vm", path)
            assert status == 400, body
            assert ".status.portForward.ports is not a port list" in body["message"]


def edited(name: str, *, trusted: str, edited: str) -> dict[str, Any]:
    """A Machine whose status names `trusted` and whose spec, as an editor set it, `edited`."""
    obj = machine(name, console=trusted)
    obj["spec"] = {"console": {"endpoint": edited}, "portForward": {"address": "127.0.0.1"}}
    return obj


@pytest.mark.parametrize("from_spec", [False, True])
async def test_endpoints_come_from_status_unless_the_config_opts_in_to_spec(
    tmp_path: Path, echo: Backend, denied: Backend, from_spec: bool
) -> None:
    # An editor wrote one listener into .spec; the status (the controller's) names the other.
    trusted, edited_in = (denied, echo) if from_spec else (echo, denied)
    obj = edited("vm", trusted=trusted.url, edited=edited_in.url)
    async with (
        start_standalone(
            tmp_path,
            obj,
            policy={"allowCIDRs": ["127.0.0.0/8"], "denyCIDRs": []},
            config={"endpointsFromSpec": from_spec},
        ) as subres,
        connect(subres.url("vm"), ssl=subres.client_ssl, additional_headers=subres.auth) as ws,
    ):
        await ws.send(b"ping")
        assert await ws.recv() == b"ping"
    assert (echo.accepted, denied.accepted) == (1, 0)
