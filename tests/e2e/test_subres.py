"""The real subres behind a real kube-apiserver, driven with real kubectl and client-go.

subres runs as ``python -m subres serve`` in cluster mode with a
ServiceAccount token, deployed from ``deploy/`` (``subresserver.py`` says
which pieces and why) and registered through its APIService with the real
caBundle. Users reach it only through kube-apiserver, which authenticates
them, authorizes them with RBAC and proxies to subres over the front-proxy
certificate; subres authenticates that proxy again and asks
SubjectAccessReview itself. Backends are echo servers on 127.0.0.1.

The tests run in file order and share one subres: the restarts come last.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import io
import json
import os
import ssl
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from PIL import Image
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus
from websockets.typing import Subprotocol

from subres.demo.vnc import Display, VncServer
from subres.serving import certs
from tests.cli.conftest import cli, cli_env, read_until, running
from tests.e2e import subresserver
from tests.e2e.controlplane import APIError, ControlPlane, KubectlResult, poll, run_sync
from tests.e2e.subresserver import GROUP, SERVER_NAME, VERSION, Subres
from tests.gotools import kubepeer
from tests.support import Backend, communicate, relay_to_unix

NS = "e2e-subres"
"""Namespace of the test Machines; group ``subres:users`` (alice) may use their subresources."""
USERS_GROUP = "subres:users"
API = f"/apis/{GROUP}/{VERSION}"
SUBRESOURCES = {
    *("console", "vnc", "screenshot", "portforward", "usbredir"),
    *("console-observe", "vnc-observe", "log", "recordings", "sessions"),
}
"""The streams, their read-only shares, and the reads of console logs, recordings and of
who holds what."""
DISCOVERY_V2 = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"

REFLECT_TIMEOUT_S = 15.0
"""Bound on a Machine change reaching subres's watch cache."""
RECOVER_TIMEOUT_S = 90.0
"""Bound on serving again after kube-apiserver restarts (watch backoff, aggregator probes)."""
LONG_SESSION_S = 78.0
"""Longer than kube-apiserver's 60 s timeout of requests that are not long-running."""
PEER_TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def subres(control_plane: ControlPlane) -> Iterator[Subres]:
    """subres deployed, running and Available, with alice's group bound to the user role."""
    server = run_sync(subresserver.launch(control_plane))
    try:
        run_sync(bind_machine_users(control_plane))
        yield server
    finally:
        run_sync(subresserver.shutdown(server))


async def bind_machine_users(plane: ControlPlane, name: str = "machine-users") -> None:
    """Bind group `USERS_GROUP` (alice) to the user role in NS, under the binding `name`."""
    await plane.ensure_namespace(NS)
    await bind(
        plane,
        name,
        subject=f"--group={USERS_GROUP}",
        check_as=["--as=alice", f"--as-group={USERS_GROUP}"],
    )


async def bind(
    plane: ControlPlane,
    name: str,
    *,
    subject: str,
    check_as: list[str],
    role: str = "subres-machine-user",
    subresource: str = "console",
    can_i: tuple[str, ...] = (),
) -> None:
    """A RoleBinding in NS to a ClusterRole; waits until RBAC applies it.

    Applied means `kubectl auth can-i` says yes to `can_i` (by default: get
    `subresource` of machines in our group).
    """
    question = can_i or ("get", f"machines.{GROUP}", f"--subresource={subresource}")
    # Applied, not created: modules that share the session's control plane (and this
    # module's `subres` fixture) bind the same name again.
    manifest = (
        await plane.kubectl(
            "create",
            "rolebinding",
            name,
            "-n",
            NS,
            f"--clusterrole={role}",
            subject,
            "--dry-run=client",
            "-o",
            "yaml",
        )
    ).check()
    (await plane.kubectl("apply", "-f", "-", stdin=manifest.stdout)).check()

    async def bound() -> bool:
        answer = await plane.kubectl("auth", "can-i", *question, "-n", NS, *check_as)
        return answer.stdout.strip() == "yes"

    if not await poll(bound, timeout_s=20.0):
        raise plane.failure(f"RoleBinding {name} to {role} never took effect")


# -- Machines ----------------------------------------------------------------


async def put_machine(
    plane: ControlPlane,
    name: str,
    *,
    console: str | None = None,
    vnc: str | None = None,
    forward: tuple[str, list[int]] | None = None,
    phase: str = "Running",
    node: str | None = None,
    annotations: Mapping[str, str] | None = None,
) -> None:
    """Create or update a Machine with real kubectl, then set its status subresource.

    The backends go in `.status`, where subres reads them, written as a
    machine controller would: through the status subresource
    (with `nodeName` when `node` is given).
    """
    status: dict[str, Any] = {"phase": phase, **({"nodeName": node} if node else {})}
    if console is not None:
        status["console"] = {"endpoint": console}
    if vnc is not None:
        status["vnc"] = {"endpoint": vnc}
    if forward is not None:
        status["portForward"] = {"address": forward[0], "ports": forward[1]}
    obj = {
        "apiVersion": "subres.dev/v1alpha1",
        "kind": "Machine",
        "metadata": {"name": name, "namespace": NS, "annotations": dict(annotations or {})},
        "spec": {},
    }
    (await plane.kubectl("apply", "-f", "-", stdin=json.dumps(obj))).check()
    (await set_status(plane, name, status)).check()


async def set_status(
    plane: ControlPlane, name: str, status: dict[str, Any], *, user: str = "admin"
) -> KubectlResult:
    """Replace Machine `name`'s status through the status subresource, as `user`."""
    patch = json.dumps([{"op": "add", "path": "/status", "value": status}])
    return await plane.kubectl(
        "patch", "machine", name, "-n", NS, "--subresource=status", "--type=json", "-p", patch,
        user=user,
    )  # fmt: skip


def machine_path(name: str, sub: str) -> str:
    return f"{API}/namespaces/{NS}/machines/{name}/{sub}"


# -- WebSocket consoles --------------------------------------------------------


@dataclass(frozen=True)
class Route:
    """How a WebSocket client reaches a console: through kube-apiserver or straight to subres."""

    base: str
    """``wss://127.0.0.1:<port>``."""
    context: ssl.SSLContext
    headers: Mapping[str, str]
    server_hostname: str | None = None


def via_apiserver(plane: ControlPlane, user: str) -> Route:
    """Through kube-apiserver with static user `user`'s bearer token."""
    return with_token(plane, plane.users[user].token)


def with_token(plane: ControlPlane, token: str) -> Route:
    """Through kube-apiserver with a bearer token (the way kubectl plugins go)."""
    return Route(
        base=plane.url.replace("https://", "wss://"),
        context=ssl.create_default_context(cafile=str(plane.server_ca)),
        headers={"Authorization": f"Bearer {token}"},
    )


def direct(
    server: Subres, client: certs.KeyPair | None, headers: Mapping[str, str] | None = None
) -> Route:
    """Straight to subres, presenting `client`'s certificate (or none) and `headers`."""
    return Route(
        base=server.url.replace("https://", "wss://"),
        context=server.ssl_context(client),
        headers=dict(headers or {}),
        server_hostname=SERVER_NAME,
    )


@asynccontextmanager
async def console(
    route: Route,
    name: str,
    *,
    subprotocols: list[str] | None = None,
    sub: str = "console",
    query: str = "",
) -> AsyncIterator[ClientConnection]:
    """A console (or `sub`) WebSocket to Machine `name`, raw binary unless `subprotocols` say."""
    extra: dict[str, Any] = {}
    if route.server_hostname is not None:
        extra["server_hostname"] = route.server_hostname
    async with connect(
        route.base + machine_path(name, sub) + query,
        ssl=route.context,
        additional_headers=dict(route.headers),
        subprotocols=[Subprotocol(p) for p in subprotocols or ()] or None,
        proxy=None,
        compression=None,
        max_size=None,
        open_timeout=15,
        **extra,
    ) as ws:
        yield ws


async def refused(
    route: Route, name: str, *, sub: str = "console", query: str = ""
) -> tuple[int, dict[str, Any]]:
    """The status and Status body of a console (or `sub`) upgrade that must be refused."""
    with pytest.raises(InvalidStatus) as caught:
        async with console(route, name, sub=sub, query=query):
            pass
    response = caught.value.response
    return response.status_code, json.loads(response.body or b"{}")


async def echoed(ws: ClientConnection, payload: bytes, *, timeout_s: float = 20.0) -> bytes:
    """Send `payload` in 64 KiB messages and collect as many bytes back."""
    chunk = 64 << 10

    async def send() -> None:
        for offset in range(0, len(payload), chunk):
            await ws.send(payload[offset : offset + chunk])

    async def receive() -> bytes:
        got = bytearray()
        while len(got) < len(payload):
            message = await ws.recv()
            assert isinstance(message, bytes), message
            got += message
        return bytes(got)

    async with asyncio.timeout(timeout_s):
        _, back = await asyncio.gather(send(), receive())
    return back


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def assert_echoes(route: Route, name: str, size: int = 1 << 20) -> None:
    """One console session to `name` carries `size` random bytes there and back intact."""
    payload = os.urandom(size)
    async with console(route, name) as ws:
        assert digest(await echoed(ws, payload)) == digest(payload)


async def sessions_reach(route: Route, name: str, backend: Backend) -> bool:
    """Open echo sessions to `name` until one reaches `backend` (a Machine change has
    reached subres's cache); False after REFLECT_TIMEOUT_S."""

    async def reached() -> bool:
        before = backend.accepted
        await assert_echoes(route, name, size=1024)
        return backend.accepted > before

    return await poll(reached, timeout_s=REFLECT_TIMEOUT_S)


async def wait_served(route: Route, name: str, *, timeout_s: float = REFLECT_TIMEOUT_S) -> float:
    """Retry a console session until it echoes (the Machine reached subres); seconds taken."""
    started = time.monotonic()

    async def works() -> bool:
        try:
            await assert_echoes(route, name, size=1024)
        except InvalidStatus as exc:
            # 404/409: not in the cache yet or not Running yet; 503: not Available yet.
            assert exc.response.status_code in (404, 409, 503), exc
            return False
        return True

    assert await poll(works, timeout_s=timeout_s), f"{name} not served in {timeout_s}s"
    return time.monotonic() - started


# -- registration and discovery --------------------------------------------------


async def test_apiservice_is_available_and_discovery_lists_the_subresources(
    control_plane: ControlPlane, subres: Subres
) -> None:
    assert await subres.available_status() == "True"

    async def api_versions() -> None:
        listed = (await control_plane.kubectl("api-versions")).check().stdout.split()
        assert f"{GROUP}/{VERSION}" in listed

    async def resource_list(user: str) -> None:
        # alice reaches it through the front proxy and subres's own SubjectAccessReview.
        raw = await control_plane.kubectl("get", "--raw", API, user=user)
        doc = raw.check().json()
        assert doc["kind"] == "APIResourceList" and doc["groupVersion"] == f"{GROUP}/{VERSION}"
        names = {r["name"] for r in doc["resources"]}
        assert names == {f"machines/{sub}" for sub in SUBRESOURCES} | {"sessions"}, names

    await asyncio.gather(
        api_versions(),
        resource_list("admin"),
        resource_list("alice"),
        aggregated_discovery_lists_the_group(control_plane),
    )


async def aggregated_discovery_lists_the_group(plane: ControlPlane) -> None:
    """kube-apiserver's merged ``/apis`` v2 document carries our group, fetched fresh."""
    last: Any = None

    async def listed() -> bool:
        nonlocal last
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
            session.get(
                plane.url + "/apis", headers={"Accept": DISCOVERY_V2}, ssl=plane.admin_ssl_context()
            ) as response,
        ):
            assert response.status == 200
            assert response.headers["Content-Type"] == DISCOVERY_V2
            doc = await response.json(content_type=None)
        assert doc["apiVersion"] == "apidiscovery.k8s.io/v2"
        ours = [g for g in doc["items"] if g["metadata"]["name"] == GROUP]
        last = ours
        if not ours or ours[0]["versions"][0].get("freshness") != "Current":
            return False
        [version] = ours[0]["versions"]
        assert version["version"] == VERSION
        machines, sessions = version["resources"]
        assert (machines["resource"], sessions["resource"]) == ("machines", "sessions")
        assert sessions["verbs"] == ["list"]
        verbs = {s["subresource"]: set(s["verbs"]) for s in machines["subresources"]}
        assert set(verbs) == SUBRESOURCES
        # WebSocket upgrades are GETs, SPDY upgrades POSTs (create).
        assert verbs["console"] == verbs["portforward"] == {"get", "create"}
        return True

    assert await poll(listed, timeout_s=30.0), f"group not in aggregated discovery: {last}"


# -- consoles and authentication ---------------------------------------------------


async def test_console_through_kube_apiserver_for_a_bound_user_only(
    control_plane: ControlPlane, subres: Subres, backend: Backend
) -> None:
    await put_machine(control_plane, "console-1", console=backend.url)
    alice = via_apiserver(control_plane, "alice")
    await wait_served(alice, "console-1")
    accepted = backend.accepted

    await assert_echoes(alice, "console-1", size=4 << 20)
    assert backend.accepted == accepted + 1

    code, status = await refused(via_apiserver(control_plane, "bob"), "console-1")
    assert code == 403, status
    assert status["kind"] == "Status" and status["reason"] == "Forbidden"
    assert 'User "bob" cannot get resource "machines/console"' in status["message"]
    assert backend.accepted == accepted + 1, "a refused user reached the backend"


async def test_console_for_a_service_account_bound_in_the_namespace(
    control_plane: ControlPlane, subres: Subres, backend: Backend
) -> None:
    # kube-apiserver passes a ServiceAccount's extra attributes (credential id) as
    # percent-encoded X-Remote-Extra-* headers; subres's own review must accept them.
    user = f"system:serviceaccount:{NS}:console-bot"
    token = await control_plane.service_account_token(NS, "console-bot")
    await bind(
        control_plane,
        "console-bot",
        subject=f"--serviceaccount={NS}:console-bot",
        check_as=[f"--as={user}"],
    )
    await put_machine(control_plane, "bot-1", console=backend.url)
    await wait_served(with_token(control_plane, token), "bot-1")
    await assert_echoes(with_token(control_plane, token), "bot-1")


async def test_console_with_the_token_in_a_subprotocol_as_browsers_send_it(
    control_plane: ControlPlane, subres: Subres, backend: Backend
) -> None:
    # Browsers cannot set Authorization on a WebSocket: the page offers the token as a
    # subprotocol beside the real ones (kube-apiserver refuses a token offered alone),
    # and kube-apiserver authenticates it and removes it before proxying.
    await put_machine(control_plane, "browser-1", console=backend.url)
    token = base64.urlsafe_b64encode(control_plane.users["alice"].token.encode()).rstrip(b"=")
    bearer = f"base64url.bearer.authorization.k8s.io.{token.decode()}"
    alice = via_apiserver(control_plane, "alice")
    await wait_served(alice, "browser-1")
    route = Route(base=alice.base, context=alice.context, headers={})
    payload = os.urandom(256 << 10)
    async with console(route, "browser-1", subprotocols=[bearer, "plain.kubevirt.io"]) as ws:
        assert ws.subprotocol == "plain.kubevirt.io"
        assert digest(await echoed(ws, payload)) == digest(payload)


async def test_straight_to_subres_only_the_front_proxy_certificate_names_users(
    control_plane: ControlPlane, subres: Subres, backend: Backend
) -> None:
    await put_machine(control_plane, "direct-1", console=backend.url)
    await wait_served(via_apiserver(control_plane, "alice"), "direct-1")
    accepted = backend.accepted
    as_alice = {"X-Remote-User": "alice", "X-Remote-Group": USERS_GROUP}

    # Forged headers without any certificate: anonymous, refused.
    code, status = await refused(direct(subres, None, as_alice), "direct-1")
    assert (code, status.get("reason")) == (401, "Unauthorized"), status
    # A certificate from the front-proxy CA whose CN is not in requestheader-allowed-names.
    intruder = certs.issue_client(control_plane.front_proxy_ca, user="intruder", groups=[])
    code, status = await refused(direct(subres, intruder, as_alice), "direct-1")
    assert (code, status.get("reason")) == (401, "Unauthorized"), status
    # The proxy's own certificate naming bob: subres's SubjectAccessReview says no.
    proxy = control_plane.front_proxy_client
    code, status = await refused(direct(subres, proxy, {"X-Remote-User": "bob"}), "direct-1")
    assert code == 403, status
    assert 'User "bob" cannot get resource "machines/console"' in status["message"]
    # bob's own client certificate (the client CA): the headers naming alice are ignored.
    bob_cert = certs.issue_client(control_plane.client_ca, user="bob", groups=[])
    code, status = await refused(direct(subres, bob_cert, as_alice), "direct-1")
    assert code == 403, status
    assert 'User "bob" cannot get resource "machines/console"' in status["message"]
    assert backend.accepted == accepted, "a refused request reached the backend"

    # The same headers over the proxy's certificate, and alice's own client certificate
    # from the ConfigMap's client CA, are both alice.
    await assert_echoes(direct(subres, proxy, as_alice), "direct-1")
    alice_cert = certs.issue_client(control_plane.client_ca, user="alice", groups=[USERS_GROUP])
    await assert_echoes(direct(subres, alice_cert), "direct-1")
    assert backend.accepted == accepted + 2


# -- screenshots: a plain proxied GET, and a narrower role ------------------------------


async def screenshot(plane: ControlPlane, user: str, name: str) -> tuple[int, str, bytes]:
    """GET the screenshot subresource through kube-apiserver as `user`."""
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
        session.get(
            plane.url + machine_path(name, "screenshot"),
            headers={"Authorization": f"Bearer {plane.users[user].token}"},
            ssl=ssl.create_default_context(cafile=str(plane.server_ca)),
        ) as response,
    ):
        return response.status, response.content_type, await response.read()


@asynccontextmanager
async def vnc_display(socket: Path) -> AsyncIterator[tuple[Display, str]]:
    """The demo RFB server (a unix socket) behind a TCP port on 127.0.0.1; its URL.

    TCP because the e2e server's endpoint policy allows loopback TCP, not this socket.
    """
    display = Display(clock=lambda: "12:00:00")
    server = VncServer(socket, display=display)
    await server.start()

    tcp = await Backend(handler=functools.partial(relay_to_unix, socket)).start_tcp()
    try:
        yield display, tcp.url
    finally:
        await tcp.stop()
        await server.stop()


async def test_screenshot_through_kube_apiserver_for_the_viewer_role(
    control_plane: ControlPlane, subres: Subres, tmp_path: Path
) -> None:
    async with vnc_display(tmp_path / "vnc.sock") as (display, url):
        await put_machine(control_plane, "screen-1", vnc=url)

        async def served() -> bool:
            code, _, _ = await screenshot(control_plane, "alice", "screen-1")
            assert code in (200, 404, 409), code
            return code == 200

        assert await poll(served, timeout_s=REFLECT_TIMEOUT_S), subres.logs()
        code, _, body = await screenshot(control_plane, "bob", "screen-1")
        assert code == 403, body

        await bind(
            control_plane,
            "bob-views-screens",
            subject="--user=bob",
            check_as=["--as=bob"],
            role="subres-screenshot-viewer",
            subresource="screenshot",
        )
        code, content_type, png = await screenshot(control_plane, "bob", "screen-1")
        assert (code, content_type) == (200, "image/png")
        image = Image.open(io.BytesIO(png))
        assert image.size == (display.width, display.height)
        assert image.convert("RGB").tobytes() == bytes(display.rgb)
        # The viewer role grants screenshots, not the console.
        code, status = await refused(via_apiserver(control_plane, "bob"), "screen-1")
        assert code == 403, status


# -- the watch cache -------------------------------------------------------------------


# -- operators: Prometheus scraping with the monitoring component's RBAC ------------------


MONITORING = Path(__file__).resolve().parents[2] / "deploy" / "components" / "monitoring"


async def scrape(subres: Subres, token: str) -> tuple[int, str]:
    """GET subres's /metrics straight (as Prometheus does, pod by pod) with `token`."""
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
        session.get(
            subres.url + "/metrics",
            headers={"Authorization": f"Bearer {token}"},
            ssl=subres.ssl_context(),
            server_hostname=SERVER_NAME,
        ) as response,
    ):
        return response.status, await response.text()


async def test_a_scraper_bound_by_the_monitoring_component_reads_metrics(
    control_plane: ControlPlane, subres: Subres
) -> None:
    rbac = list(yaml.safe_load_all((MONITORING / "rbac-metrics.yaml").read_text()))
    (subject,) = rbac[1]["subjects"]
    scraper = await control_plane.service_account_token(subject["namespace"], subject["name"])
    stranger = await control_plane.service_account_token(subject["namespace"], "not-prometheus")
    status, _ = await scrape(subres, scraper)
    assert status == 403  # not bound yet
    for doc in rbac:
        await control_plane.apply(doc)

    async def readable() -> bool:
        # subres caches a denied SubjectAccessReview for 10 s.
        return (await scrape(subres, scraper))[0] == 200

    assert await poll(readable, timeout_s=REFLECT_TIMEOUT_S), "/metrics stayed forbidden"
    _, text = await scrape(subres, scraper)
    assert "subres_requests_total{" in text and "process_open_fds " in text
    assert "subres_auth_cache_requests_total{" in text
    assert (await scrape(subres, stranger))[0] == 403


async def test_machine_changes_reach_subres_within_seconds(
    control_plane: ControlPlane, subres: Subres, backend: Backend
) -> None:
    other = await Backend().start_tcp()
    try:
        alice = via_apiserver(control_plane, "alice")
        await put_machine(control_plane, "crud-1", console=backend.url)
        created_s = await wait_served(alice, "crud-1")
        assert backend.accepted >= 1 and other.accepted == 0

        # A new endpoint: sessions go to the other backend.
        await put_machine(control_plane, "crud-1", console=other.url)

        assert await sessions_reach(alice, "crud-1", other), subres.logs()

        # Not Running any more: a Conflict Status before any dial.
        await put_machine(control_plane, "crud-1", console=other.url, phase="Stopped")

        async def stopped() -> bool:
            try:
                await assert_echoes(alice, "crud-1", size=1024)
            except InvalidStatus as exc:
                assert exc.response.status_code == 409, exc
                assert b"is not Running" in exc.response.body
                return True
            return False

        assert await poll(stopped, timeout_s=REFLECT_TIMEOUT_S), subres.logs()

        (await control_plane.kubectl("delete", "machine", "crud-1", "-n", NS)).check()
        last: APIError | None = None

        async def gone() -> bool:
            nonlocal last
            with pytest.raises(APIError) as caught:
                await control_plane.api("GET", machine_path("crud-1", "console"))
            last = caught.value
            return last.status == 404

        assert await poll(gone, timeout_s=REFLECT_TIMEOUT_S), f"{last}\n{subres.logs()}"
        assert last is not None
        status = json.loads(last.body)
        assert (status["kind"], status["reason"]) == ("Status", "NotFound")
        assert status["details"]["name"] == "crud-1"
        assert created_s < REFLECT_TIMEOUT_S
    finally:
        await other.stop()


# -- trusted endpoints -------------------------------------------------------------------


async def test_namespace_editors_cannot_choose_where_subres_dials(
    control_plane: ControlPlane, subres: Subres, backend: Backend
) -> None:
    """bob may edit Machines through the aggregated `edit` role, and tries to aim subres
    at a listener of his choosing (`wanted`); alice's console must never reach it."""
    wanted, moved = await Backend().start_tcp(), await Backend().start_tcp()
    alice = via_apiserver(control_plane, "alice")
    # The kube-controller-manager's aggregation gives `edit` deploy/'s machines rules.
    await bind(
        control_plane,
        "bob-edits",
        subject="--user=bob",
        check_as=["--as=bob"],
        role="edit",
        can_i=("patch", "machines.subres.dev"),
    )
    try:
        await put_machine(control_plane, "trusted-1", console=backend.url)
        await wait_served(alice, "trusted-1")
        for role in ("edit", "admin"):
            as_role = ["--as=someone", f"--as-group=probe:{role}"]
            await bind(
                control_plane,
                f"probe-{role}",
                subject=f"--group=probe:{role}",
                check_as=as_role,
                role=role,
                can_i=("patch", "machines.subres.dev"),
            )
            status_write = ("patch", "machines.subres.dev", "--subresource=status", "-n", NS)
            answer = await control_plane.kubectl("auth", "can-i", *status_write, *as_role)
            assert answer.stdout.strip() == "no", (role, answer)

        # The status subresource: refused.
        evil = {"phase": "Running", "console": {"endpoint": wanted.url}}
        result = await set_status(control_plane, "trusted-1", evil, user="bob")
        assert result.returncode != 0 and "forbidden" in result.stderr.lower(), result
        # The main resource: allowed, but .status in it is ignored, and .spec is not read.
        sneaky = json.dumps({"spec": {"console": {"endpoint": wanted.url}}, "status": evil})
        edit = ("patch", "machine", "trusted-1", "-n", NS, "--type=merge", "-p", sneaky)
        (await control_plane.kubectl(*edit, user="bob")).check()
        stored = (
            await control_plane.kubectl("get", "machine", "trusted-1", "-n", NS, "-o", "json")
        ).json()
        assert stored["spec"]["console"]["endpoint"] == wanted.url
        assert stored["status"]["console"]["endpoint"] == backend.url
        # A Machine bob creates carries no status at all: nothing to dial.
        created = {
            "apiVersion": "subres.dev/v1alpha1",
            "kind": "Machine",
            "metadata": {"name": "bobs-1", "namespace": NS},
            "spec": {"console": {"endpoint": wanted.url}},
            "status": evil,
        }
        (
            await control_plane.kubectl("apply", "-f", "-", stdin=json.dumps(created), user="bob")
        ).check()

        # The controller's next status write comes after bob's edits in the watch:
        # once sessions follow it, subres has seen everything bob did.
        await put_machine(control_plane, "trusted-1", console=moved.url)

        assert await sessions_reach(alice, "trusted-1", moved), subres.logs()
        code, status = await refused(alice, "bobs-1")
        assert code == 409 and "is not Running" in status["message"], status
        assert wanted.accepted == 0
    finally:
        for binding in ("bob-edits", "probe-edit", "probe-admin"):
            await control_plane.kubectl("delete", "rolebinding", binding, "-n", NS)
        await control_plane.kubectl("delete", "machine", "bobs-1", "-n", NS, "--ignore-not-found")
        await wanted.stop()
        await moved.stop()


# -- client-go peers ---------------------------------------------------------------------


@asynccontextmanager
async def port_forward(
    kubeconfig: Path, path: str, remote: int, *, transport: str
) -> AsyncIterator[int]:
    """``kubepeer portforward`` of `remote` through kube-apiserver; its local port."""
    proc = await asyncio.create_subprocess_exec(
        str(kubepeer()), "portforward", "--kubeconfig", str(kubeconfig), "--url", path,
        "--transport", transport, f"0:{remote}",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stderr is not None
        async with asyncio.timeout(PEER_TIMEOUT_S):
            first = await proc.stdout.readline()
            if first != b"ready\n":
                problem = (await proc.stderr.read()).decode(errors="replace")
                raise AssertionError(f"kubepeer portforward did not start: {first!r} {problem}")
            [listed] = json.loads(await proc.stdout.readline())
        yield int(listed["local"])
    finally:
        await _end(proc)


async def _end(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None and proc.stdin is not None:
        proc.stdin.close()  # EOF on stdin stops kubepeer cleanly
    try:
        async with asyncio.timeout(10):
            await proc.wait()
    except TimeoutError:
        proc.kill()
        await proc.wait()


async def forwarded_echo(port: int, payload: bytes) -> bytes:
    """Send `payload` to a local forwarded port, half-close, read everything back."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        async with asyncio.timeout(PEER_TIMEOUT_S):

            async def send() -> None:
                writer.write(payload)
                await writer.drain()
                writer.write_eof()

            _, back = await asyncio.gather(send(), reader.read(-1))
    finally:
        writer.close()
    return back


async def exec_echo(kubeconfig: Path, path: str, payload: bytes, *, transport: str) -> bytes:
    """``kubepeer exec`` against a console: stdin to the backend, the backend to stdout."""
    proc = await asyncio.create_subprocess_exec(
        str(kubepeer()), "exec", "--kubeconfig", str(kubeconfig), "--url", path,
        "--transport", transport,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    code, out, err = await communicate(proc, payload, bound=PEER_TIMEOUT_S)
    assert code == 0, err.decode(errors="replace")
    return out


@pytest.mark.parametrize("transport", ["spdy", "websocket"])
async def test_client_go_port_forward_and_exec_through_kube_apiserver(
    control_plane: ControlPlane, subres: Subres, backend: Backend, transport: str
) -> None:
    port = int(backend.url.rsplit(":", 1)[1])
    name = f"pf-{transport}"
    await put_machine(control_plane, name, console=backend.url, forward=("127.0.0.1", [port]))
    await wait_served(via_apiserver(control_plane, "alice"), name)
    kubeconfig = control_plane.kubeconfig_for("alice")
    payload = os.urandom(2 << 20)

    async def forwarding() -> None:
        async with port_forward(
            kubeconfig, machine_path(name, "portforward"), port, transport=transport
        ) as local:
            # Two connections at once over the one tunnel.
            backs = await asyncio.gather(
                forwarded_echo(local, payload), forwarded_echo(local, payload[::-1])
            )
        assert [digest(b) for b in backs] == [digest(payload), digest(payload[::-1])]

    async def executing() -> None:
        out = await exec_echo(
            kubeconfig, machine_path(name, "console"), payload, transport=transport
        )
        assert digest(out) == digest(payload)

    await asyncio.gather(forwarding(), executing())


async def dry_run(plane: ControlPlane, path: str) -> tuple[int, str]:
    """A dry run's status code and Status `status`, as alice, through kube-apiserver."""
    ctx = ssl.create_default_context(cafile=str(plane.server_ca))
    headers = {"Authorization": f"Bearer {plane.users['alice'].token}"}
    async with (
        aiohttp.ClientSession() as http,
        http.get(plane.url + path, ssl=ctx, headers=headers) as response,
    ):
        return response.status, (await response.json())["status"]


async def test_dry_runs_pass_kube_apiserver_and_subres_port_forward_uses_them(
    control_plane: ControlPlane, subres: Subres, backend: Backend
) -> None:
    """A dry run is a plain GET, proxied as any other, so its 200 reaches the client (an
    upgrade answered 200 would be a 503 here); `subres port-forward` starts with one."""
    port = int(backend.url.rsplit(":", 1)[1])
    name = "dry-run"
    forward = ("127.0.0.1", [port])
    await put_machine(control_plane, name, console=backend.url, vnc=backend.url, forward=forward)
    route = via_apiserver(control_plane, "alice")
    await wait_served(route, name)
    accepted = backend.accepted
    answers = {}
    for sub, query in (("portforward", f"?ports={port}&dryRun=All"), ("vnc", "?dryRun=All")):
        answers[sub] = await dry_run(control_plane, machine_path(name, sub) + query)
    assert answers == {"portforward": (200, "Success"), "vnc": (200, "Success")}
    assert backend.accepted == accepted  # nothing dialed
    argv = cli("--kubeconfig", control_plane.kubeconfig_for("alice"), "port-forward")
    argv += ["-n", NS, name, f"0:{port}"]
    with running(argv, env=cli_env(control_plane.workdir)) as proc:
        local = read_until(proc, rb"Forwarding from 127\.0\.0\.1:(\d+) ", timeout=PEER_TIMEOUT_S)
        payload = os.urandom(1 << 20)
        assert digest(await forwarded_echo(int(local[1]), payload)) == digest(payload)


# -- beyond kube-apiserver's request timeout --------------------------------------------


async def test_console_session_outlives_the_request_timeout(
    control_plane: ControlPlane, subres: Subres, backend: Backend
) -> None:
    await put_machine(control_plane, "long-1", console=backend.url)
    alice = via_apiserver(control_plane, "alice")
    await wait_served(alice, "long-1")
    loop = asyncio.get_running_loop()
    async with console(alice, "long-1") as ws:
        started = loop.time()
        rounds = 0
        # A message every 3 s, paced by the clock: the point is the elapsed time.
        while loop.time() - started < LONG_SESSION_S:
            message = os.urandom(1024)
            assert await echoed(ws, message, timeout_s=10.0) == message, rounds
            rounds += 1
            await asyncio.sleep(3.0)
        assert await echoed(ws, b"still here") == b"still here"
    assert loop.time() - started > LONG_SESSION_S
    assert rounds >= 20
    # The premise: kube-apiserver did time the request out at 60 s (console is not one of
    # its long-running subresources) and the upgraded connection lived on regardless.
    timed_out = [
        line
        for line in control_plane.apiserver_log().splitlines()
        if "Timeout or abort while handling" in line and machine_path("long-1", "console") in line
    ]
    assert timed_out, "kube-apiserver never timed the console request out"


# -- restarts (last: they interrupt everything above) ----------------------------------


async def test_watch_recovers_after_kube_apiserver_restarts(
    control_plane: ControlPlane, subres: Subres, backend: Backend
) -> None:
    await control_plane.restart_apiserver()
    await put_machine(control_plane, "after-apiserver-restart", console=backend.url)
    await wait_served(
        via_apiserver(control_plane, "alice"),
        "after-apiserver-restart",
        timeout_s=RECOVER_TIMEOUT_S,
    )
    assert subres.process.exited() is None


async def test_apiservice_returns_to_available_after_subres_restarts(
    control_plane: ControlPlane, subres: Subres, backend: Backend
) -> None:
    await put_machine(control_plane, "across-restart", console=backend.url)
    alice = via_apiserver(control_plane, "alice")
    await wait_served(alice, "across-restart")

    await subres.stop()
    with pytest.raises(APIError) as down:
        await control_plane.api("GET", API)
    assert down.value.status == 503, down.value
    # In a cluster the pod's EndpointSlice changes make the availability controller probe
    # again at once; an ExternalName Service has none, so touch it to the same effect.
    (
        await control_plane.kubectl(
            "annotate", "service", subresserver.SERVICE, "-n", subresserver.NAMESPACE,
            "--overwrite", f"e2e/subres-stopped={time.time()}",
        )
    ).check()  # fmt: skip

    async def unavailable() -> bool:
        return await subres.available_status() == "False"

    assert await poll(unavailable, timeout_s=20.0), subres.logs()

    await subres.start()
    await subres.wait_available()
    await assert_echoes(alice, "across-restart")
