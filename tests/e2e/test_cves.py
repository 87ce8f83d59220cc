"""The known vulnerability classes through a real kube-apiserver and its real front-proxy PKI.

- CVE-2018-1002105: an upgrade subres refuses, asked through kube-apiserver,
  leaves no connection on which a second request reaches subres or a backend.
- CVE-2020-8559 / CVE-2022-3172: kube-apiserver turns an aggregated server's
  redirect into a 502 (`--aggregator-reject-forwarding-redirect`, on by
  default); the one subres used to send (an old openapi v3 hash) is a 200 now.
- CVE-2025-64432's class: a certificate from the cluster's front-proxy CA
  whose common names include one outside `requestheader-allowed-names` is no
  proxy, straight to subres.

`tests/server/test_cve_regressions.py` has the same classes at subres's door.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterator

import aiohttp
import pytest

from tests.e2e import subresserver
from tests.e2e.controlplane import ControlPlane, poll, run_sync
from tests.e2e.subresserver import GROUP, SERVER_NAME, VERSION, Subres
from tests.e2e.test_subres import (
    USERS_GROUP,
    bind_machine_users,
    direct,
    machine_path,
    put_machine,
    refused,
    via_apiserver,
    wait_served,
)
from tests.server.test_cve_regressions import answer, closed, proxy_certificate, upgrade_request
from tests.support import Backend


@pytest.fixture(scope="module")
def server(control_plane: ControlPlane) -> Iterator[Subres]:
    """subres deployed and Available, alice's group bound to the user role."""
    launched = run_sync(subresserver.launch(control_plane))
    try:
        run_sync(bind_machine_users(control_plane, "cve-machine-users"))
        yield launched
    finally:
        run_sync(subresserver.shutdown(launched))


async def served(plane: ControlPlane, name: str, backend: Backend) -> int:
    """Machine `name` on `backend`, served through kube-apiserver; the backend's count then."""
    await put_machine(plane, name, console=backend.url)
    await wait_served(via_apiserver(plane, "alice"), name)
    return backend.accepted


async def test_a_refused_upgrade_through_kube_apiserver_leaves_no_connection_to_reuse(
    control_plane: ControlPlane, server: Subres, backend: Backend
) -> None:
    accepted = await served(control_plane, "cve-1", backend)
    token = control_plane.users["alice"].token
    host, port = control_plane.url.removeprefix("https://").split(":")
    context = ssl.create_default_context(cafile=str(control_plane.server_ca))
    reader, writer = await asyncio.open_connection(host, int(port), ssl=context)
    try:
        # Allowed by RBAC, refused by subres: no such Machine.
        writer.write(
            upgrade_request(machine_path("cve-none", "console"), Authorization=f"Bearer {token}")
        )
        status, _ = await answer(reader)
        assert status == 404
        # Whatever comes next on that connection reaches nobody.
        writer.write(upgrade_request(machine_path("cve-1", "console"), X_Remote_User="admin"))
        assert await closed(reader)
    finally:
        writer.close()
    assert backend.accepted == accepted


async def test_a_refused_upgrade_straight_to_subres_closes_the_proxys_connection(
    control_plane: ControlPlane, server: Subres, backend: Backend
) -> None:
    accepted = await served(control_plane, "cve-2", backend)
    context = server.ssl_context(control_plane.front_proxy_client)
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", server.port, ssl=context, server_hostname=SERVER_NAME
    )
    try:
        writer.write(upgrade_request(machine_path("cve-2", "console"), X_Remote_User="bob"))
        status, head = await answer(reader)
        assert status == 403 and b"Connection: close" in head
        again = machine_path("cve-2", "console")
        writer.write(upgrade_request(again, X_Remote_User="alice", X_Remote_Group=USERS_GROUP))
        assert await closed(reader)
    finally:
        writer.close()
    assert backend.accepted == accepted


async def test_an_old_openapi_hash_through_kube_apiserver_is_no_refused_redirect(
    control_plane: ControlPlane, server: Subres
) -> None:
    path = f"/openapi/v3/apis/{GROUP}/{VERSION}"
    headers = {"Authorization": f"Bearer {control_plane.users['alice'].token}"}
    context = ssl.create_default_context(cafile=str(control_plane.server_ca))
    async with aiohttp.ClientSession() as http:

        async def get(query: str) -> tuple[int, bytes]:
            async with http.get(
                control_plane.url + path + query,
                headers=headers,
                ssl=context,
                allow_redirects=False,
            ) as response:
                return response.status, await response.read()

        async def aggregated() -> bool:
            return (await get(""))[0] == 200

        # kube-apiserver fetches an APIService's OpenAPI v3 in the background, a moment
        # after the service is Available: until then the group's path is a 404 of its own.
        assert await poll(aggregated, timeout_s=60.0), control_plane.logs()
        status, body = await get("?hash=0123456789")
    # Before, subres's 301 came back from kube-apiserver as a 502 ("the backend attempted
    # to redirect this request, which is not permitted").
    assert status == 200, body[:300]
    assert b'"openapi"' in body


@pytest.mark.parametrize(
    "names", [("front-proxy-client", "intruder"), ("intruder", "front-proxy-client")]
)
async def test_the_clusters_front_proxy_ca_with_an_extra_name_is_no_proxy(
    control_plane: ControlPlane, server: Subres, backend: Backend, names: tuple[str, ...]
) -> None:
    accepted = await served(control_plane, "cve-3", backend)
    forged = proxy_certificate(control_plane.front_proxy_ca, *names)
    as_alice = {"X-Remote-User": "alice", "X-Remote-Group": USERS_GROUP}
    code, status = await refused(direct(server, forged, as_alice), "cve-3")
    assert (code, status.get("reason")) == (401, "Unauthorized"), status
    assert backend.accepted == accepted
