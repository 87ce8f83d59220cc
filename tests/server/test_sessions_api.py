"""Who holds a console: the sessions read API, as JSON, as a kubectl Table, and through kubectl."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from websockets.asyncio.client import ClientConnection

from subres.serving import units
from tests.support import GROUP_VERSION, Backend, Standalone, machine, start_standalone, wait_for

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"


@pytest.fixture
async def subres(tmp_path: Path, backend: Backend) -> AsyncIterator[Standalone]:
    async with start_standalone(
        tmp_path, machine("vm1", console=backend.url), machine("vm2", console=backend.url)
    ) as s:
        yield s


@contextlib.asynccontextmanager
async def attached(
    subres: Standalone, name: str, sub: str, user: str
) -> AsyncIterator[ClientConnection]:
    async with subres.websocket(subres.url(name, sub), "v5.channel.k8s.io", user=user) as ws:
        await asyncio.wait_for(ws.recv(), 5)  # the hello: the session is registered
        yield ws


async def get(subres: Standalone, path: str, *, accept: str = "application/json") -> Any:
    async with (
        aiohttp.ClientSession() as http,
        http.get(
            subres.base + path, ssl=subres.client_ssl, headers={**subres.auth, "Accept": accept}
        ) as r,
    ):
        return r.status, await r.json()


async def test_a_machines_sessions_say_who_how_and_how_much(subres: Standalone) -> None:
    async with (
        attached(subres, "vm1", "console", "alice") as alice,
        attached(subres, "vm1", "console-observe", "bob") as bob,
        attached(subres, "vm2", "console", "carol"),
    ):
        await alice.send(b"\x00hello")
        assert await asyncio.wait_for(alice.recv(), 5) == b"\x01hello"
        assert await asyncio.wait_for(bob.recv(), 5) == b"\x01hello"
        path = f"/apis/{GROUP_VERSION}/namespaces/default/machines/vm1/sessions"
        status, body = await get(subres, path)
    assert status == 200
    assert (body["kind"], body["apiVersion"]) == ("SessionList", GROUP_VERSION)
    by_user = {item["user"]: item for item in body["items"]}
    assert set(by_user) == {"alice", "bob"}
    writer, observer = by_user["alice"], by_user["bob"]
    assert (writer["mode"], observer["mode"]) == ("writer", "observer")
    assert writer["subresource"] == observer["subresource"] == "console"
    assert writer["parent"] == {
        "apiVersion": "subres.dev/v1alpha1",
        "kind": "Machine",
        "name": "vm1",
    }
    assert writer["clientAddress"] == "127.0.0.1"
    assert (writer["bytesUp"], writer["bytesDown"]) == (5, 5)
    assert (observer["bytesUp"], observer["bytesDown"]) == (0, 5)
    assert writer["metadata"]["name"].startswith("vm1-console-")
    assert writer["since"].endswith("Z") and writer["dialect"] == "v5.channel.k8s.io"


async def test_namespace_and_cluster_lists_and_the_table_kubectl_asks_for(
    subres: Standalone,
) -> None:
    async with (
        attached(subres, "vm1", "console", "alice"),
        attached(subres, "vm2", "console-observe", "bob"),
    ):
        _, namespaced = await get(subres, f"/apis/{GROUP_VERSION}/namespaces/default/sessions")
        _, everywhere = await get(subres, f"/apis/{GROUP_VERSION}/sessions")
        _, elsewhere = await get(subres, f"/apis/{GROUP_VERSION}/namespaces/other/sessions")
        _, table = await get(
            subres, f"/apis/{GROUP_VERSION}/namespaces/default/sessions", accept=TABLE
        )
    assert [i["parent"]["name"] for i in namespaced["items"]] == ["vm1", "vm2"]
    assert everywhere["items"] == namespaced["items"]
    assert elsewhere["items"] == []
    assert table["kind"] == "Table"
    names = [c["name"] for c in table["columnDefinitions"]]
    assert names[:6] == ["Name", "Machine", "Subresource", "Mode", "User", "Client"]
    cells = [row["cells"] for row in table["rows"]]
    assert [c[1:5] for c in cells] == [
        ["vm1", "console", "writer", "alice"],
        ["vm2", "console", "observer", "bob"],
    ]
    assert table["rows"][0]["object"]["metadata"]["namespace"] == "default"


async def test_unknown_machines_and_watches_are_refused(subres: Standalone) -> None:
    status, body = await get(
        subres, f"/apis/{GROUP_VERSION}/namespaces/default/machines/nope/sessions"
    )
    assert status == 404 and body["kind"] == "Status"
    status, body = await get(subres, f"/apis/{GROUP_VERSION}/sessions?watch=true")
    assert status == 405 and "cannot be watched" in body["message"]
    status, body = await get(subres, f"/apis/{GROUP_VERSION}/sessions?watch=yes")
    assert status == 400 and body["message"] == "watch must be true or false, not 'yes'"


async def test_ended_sessions_leave_the_list(subres: Standalone) -> None:
    async with attached(subres, "vm1", "console", "alice"):
        pass
    await wait_for(lambda: not subres.server.state.sessions.live)
    _, body = await get(subres, f"/apis/{GROUP_VERSION}/namespaces/default/machines/vm1/sessions")
    assert body["items"] == []


async def test_kubectl_get_sessions_prints_the_table(subres: Standalone, kubectl_bin: Path) -> None:
    async with attached(subres, "vm1", "console-observe", "bob"):
        proc = await asyncio.create_subprocess_exec(
            str(kubectl_bin),
            "--kubeconfig",
            str(subres.kubeconfig()),
            "get",
            "sessions.subresources.subres.dev",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        async with asyncio.timeout(30):
            out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    header, row = out.decode().splitlines()
    assert header.split() == [
        "NAME",
        "MACHINE",
        "SUBRESOURCE",
        "MODE",
        "USER",
        "CLIENT",
        "UP",
        "DOWN",
        "AGE",
    ]
    assert row.split()[1:6] == ["vm1", "console", "observer", "bob", "127.0.0.1"]


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (45, "45s"),
        (192, "3m12s"),
        (180, "3m"),
        (1500, "25m"),
        (18180, "5h3m"),
        (72000, "20h"),
        (273600, "3d4h"),
        (12 * 86400, "12d"),
    ],
)
def test_ages_read_as_kubectls(seconds: int, shown: str) -> None:
    assert units.human_age(seconds) == shown


def test_byte_counts_read_in_binary_units() -> None:
    assert [units.human_bytes(n) for n in (512, 1536, 5 << 20, 3 << 30)] == [
        "512 B",
        "1.5 KiB",
        "5.0 MiB",
        "3.0 GiB",
    ]
