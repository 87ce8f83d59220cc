"""Recordings belong to one object of one kind, and one namespace's never make room for another's.

- A Host's recordings are not a Machine's of the same name (the leak the
  review found), nor a deleted Host's those of a new one; an object that
  does not exist serves none (404).
- Names that cannot be folders are a 400 Status, never a 500.
- A namespace past its cap deletes its own oldest recordings; an audit
  (`record: always`) is deleted only by age; a full namespace drops output
  (a marker says so) and refuses new recorded sessions with 503.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from subres.sessions import recordings as recordings_module
from tests.consoles import stdout_until
from tests.support import GROUP_VERSION, Backend, Standalone, machine, start_standalone, wait_for

V5 = "v5.channel.k8s.io"
RECORD = {"subres.dev/record-console": "true"}
HOSTS = {
    "resource": "hosts",
    "kind": "Host",
    "source": {"group": "metal.example", "version": "v1"},
    "subresources": {"console": {"endpoint": ".status.console.endpoint"}},
}


def machines(record: str = "annotated") -> dict[str, Any]:
    return {
        "resource": "machines",
        "kind": "Machine",
        "source": {"group": "subres.dev", "version": "v1alpha1", "resource": "machines"},
        "subresources": {"console": {"endpoint": ".status.console.endpoint", "record": record}},
    }


def host(name: str, url: str, *, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": "metal.example/v1",
        "kind": "Host",
        "metadata": {"name": name, "namespace": "default", "uid": uid, "annotations": RECORD},
        "status": {"console": {"endpoint": url}},
    }


def vm(name: str, url: str, *, namespace: str = "default", uid: str = "") -> dict[str, Any]:
    obj = machine(name, console=url, annotations=RECORD)
    obj["metadata"].update(namespace=namespace, uid=uid or f"uid-{namespace}-{name}")
    return obj


def settings(tmp: Path, *parents: dict[str, Any], **files: Any) -> dict[str, Any]:
    recordings = {"directory": str(tmp / "recordings"), **files}
    return {"parents": list(parents), "consoles": {"recordings": recordings}}


async def get(subres: Standalone, path: str) -> tuple[int, dict[str, Any] | bytes]:
    url = subres.api_url(path, scheme="https")
    async with (
        aiohttp.ClientSession() as http,
        http.get(url, ssl=subres.client_ssl, headers=subres.auth) as r,
    ):
        body = await r.read()
        return r.status, json.loads(body) if r.content_type == "application/json" else body


async def record(subres: Standalone, path: str, lines: int = 1, size: int = 20) -> None:
    """One recorded session on the console at `path`, `lines` lines of `size` bytes."""
    async with subres.websocket(subres.api_url(path), V5) as ws:
        for index in range(lines):
            text = f"{index:04} {'x' * size}\r\n".encode()
            await ws.send(b"\x00" + text)
            await stdout_until(ws, text)
    await wait_for(lambda: not subres.server.state.sessions.live)
    await subres.server.state.recordings.stop()  # written now


def cached(subres: Standalone, resource: str, name: str, *, uid: str = "") -> bool:
    obj = subres.server.state.caches[resource].get("default", name)
    return obj is not None and (not uid or obj["metadata"]["uid"] == uid)


@pytest.fixture
def quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    """No other replica shares the files: a finished file may go at once."""
    monkeypatch.setattr(recordings_module, "QUIET", 0.0)


async def test_a_hosts_recordings_are_served_under_that_host_only(
    tmp_path: Path, backend: Backend
) -> None:
    config = settings(tmp_path, machines(), HOSTS)
    async with start_standalone(
        tmp_path, host("shared", backend.url, uid="host-1"), config=config
    ) as subres:
        await record(subres, "hosts/shared/console")
        code, listed = await get(subres, "hosts/shared/recordings")
        assert code == 200 and isinstance(listed, dict)
        [item] = listed["items"]
        # No Machine of that name: nothing to serve under it, not the Host's.
        code, status = await get(subres, "machines/shared/recordings")
        assert code == 404 and isinstance(status, dict) and status["kind"] == "Status"
        code, _ = await get(subres, f"machines/shared/recordings/{item['name']}")
        assert code == 404
        # A Machine of that name: its own recordings, none of the Host's.
        subres.write_machines(host("shared", backend.url, uid="host-1"), vm("shared", backend.url))
        await wait_for(lambda: cached(subres, "machines", "shared"))
        code, listed = await get(subres, "machines/shared/recordings")
        assert (code, listed) == (200, {**listed, "items": []})  # type: ignore[dict-item]
        code, _ = await get(subres, f"machines/shared/recordings/{item['name']}")
        assert code == 404
        code, body = await get(subres, f"hosts/shared/recordings/{item['name']}")
        assert code == 200 and isinstance(body, bytes) and body.startswith(b'{"version": 2')
        # The Host deleted, then another made under its name: the old recordings are not its.
        subres.write_machines(vm("shared", backend.url))
        await wait_for(lambda: not cached(subres, "hosts", "shared"))
        assert (await get(subres, "hosts/shared/recordings"))[0] == 404
        subres.write_machines(host("shared", backend.url, uid="host-2"))
        await wait_for(lambda: cached(subres, "hosts", "shared", uid="host-2"))
        code, listed = await get(subres, "hosts/shared/recordings")
        assert code == 200 and isinstance(listed, dict) and listed["items"] == []


@pytest.mark.parametrize(
    "path",
    [
        f"/apis/{GROUP_VERSION}/namespaces/{'n' * 300}/machines/vm1/recordings",
        f"/apis/{GROUP_VERSION}/namespaces/default/machines/{'m' * 300}/recordings",
        f"/apis/{GROUP_VERSION}/namespaces/{'n' * 300}/machines/vm1/recordings/x.cast",
        f"/apis/{GROUP_VERSION}/namespaces/default/machines/{'m' * 300}/recordings/x.cast",
        f"/apis/{GROUP_VERSION}/namespaces/Default/machines/vm1/recordings",
    ],
)
async def test_names_that_cannot_be_folders_are_a_400_status(
    tmp_path: Path, backend: Backend, path: str
) -> None:
    config = settings(tmp_path, machines())
    async with start_standalone(tmp_path, vm("vm1", backend.url), config=config) as subres:
        code, status = await get(subres, path)
    assert code == 400 and isinstance(status, dict), status
    assert status["kind"] == "Status" and status["code"] == 400


async def test_a_full_namespace_deletes_its_own_oldest_and_leaves_the_others(
    tmp_path: Path, backend: Backend, quiet: None
) -> None:
    config = settings(tmp_path, machines(), maxNamespaceBytes=4000, maxFileBytes=1000)
    objects = (vm("vm1", backend.url), vm("vm2", backend.url, namespace="other"))
    async with start_standalone(tmp_path, *objects, config=config) as subres:
        other = f"/apis/{GROUP_VERSION}/namespaces/other/machines/vm2/console"
        await record(subres, other, lines=30)
        others = sorted((tmp_path / "recordings" / "other").rglob("*.cast"))
        for _ in range(5):
            await record(subres, "machines/vm1/console", lines=30)
        mine = list((tmp_path / "recordings" / "default").rglob("*.cast"))
        assert sum(f.stat().st_size for f in mine) <= 4000
        assert sorted((tmp_path / "recordings" / "other").rglob("*.cast")) == others


async def test_an_audit_is_never_deleted_for_room_and_a_full_namespace_refuses_sessions(
    tmp_path: Path, backend: Backend, quiet: None
) -> None:
    config = settings(tmp_path, machines(record="always"), maxNamespaceBytes=3000)
    async with start_standalone(tmp_path, vm("vm1", backend.url), config=config) as subres:
        await record(subres, "machines/vm1/console", lines=10, size=200)
        audits = sorted((tmp_path / "recordings").rglob("*.audit.cast"))
        assert audits and all(f.stat().st_size for f in audits)
        # The namespace is full of audit: more output is dropped and said so...
        async with subres.websocket(subres.url("vm1"), V5) as ws:
            for index in range(20):
                text = f"{index:04} {'y' * 200}\r\n".encode()
                await ws.send(b"\x00" + text)
                await stdout_until(ws, text)
        await wait_for(lambda: not subres.server.state.sessions.live)
        await subres.server.state.recordings.stop()
        text = b"".join(f.read_bytes() for f in (tmp_path / "recordings").rglob("*.cast"))
        assert b"bytes of output lost: the recordings of namespace default are full" in text
        assert all(f.exists() for f in audits)
        # ...and once it is known to be full, new sessions are refused before any upgrade.
        code, status = await subres.refused(subres.url("vm1"), V5)
        assert code == 503 and "recordings of namespace default fill their" in status["message"]
        # Age, only age, deletes an audit.
        old = time.time() - 7200
        for path in (tmp_path / "recordings").rglob("*.cast"):
            os.utime(path, (old, old))
    config = settings(tmp_path, machines(record="always"), maxNamespaceBytes=3000, maxAge=3600)
    async with start_standalone(tmp_path, vm("vm1", backend.url), config=config) as subres:
        await record(subres, "machines/vm1/console")
        left = list((tmp_path / "recordings").rglob("*.cast"))
        assert left and not set(left) & set(audits)


async def test_recordings_of_the_first_layout_are_left_alone_and_not_served(
    tmp_path: Path, backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    old = tmp_path / "recordings" / "default" / "vm1"
    old.mkdir(parents=True)
    name = "20240101T000000Z-0000000a.cast"
    (old / name).write_bytes(b'{"version": 2, "width": 80, "height": 24}\n')
    config = settings(tmp_path, machines())
    async with start_standalone(tmp_path, vm("vm1", backend.url), config=config) as subres:
        await record(subres, "machines/vm1/console")
        code, listed = await get(subres, "machines/vm1/recordings")
        assert code == 200 and isinstance(listed, dict)
        assert name not in [item["name"] for item in listed["items"]]
        assert (await get(subres, f"machines/vm1/recordings/{name}"))[0] == 404
    assert (old / name).exists()
    assert "1 recordings in the first layout" in caplog.text
