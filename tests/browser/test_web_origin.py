"""`subres web` lends its credentials to its own page only: the one opened from its link.

Any local process can connect to its loopback port and send any header, the
page's own `Origin` included; only the user who ran it has the key the link
carries, so a request without it gets nothing relayed.
"""

from __future__ import annotations

import base64
from urllib.parse import urlsplit

import aiohttp
import pytest

from tests.browser import cdp
from tests.browser.conftest import Demo, subres_web

CONSOLE = "/apis/subresources.subres.dev/v1alpha1/namespaces/default/machines/demo/console"
SESSIONS = CONSOLE.replace("/console", "/sessions")
RECORDINGS = CONSOLE.replace("/console", "/recordings")
V5 = "v5.channel.k8s.io"


def key_of(url: str) -> str:
    """The key in the link's fragment."""
    fragment = urlsplit(url).fragment
    assert fragment.startswith("token="), url
    return fragment.removeprefix("token=")


def bearer(key: str) -> str:
    """The subprotocol that carries `key` on a WebSocket, as the page sends it."""
    encoded = base64.urlsafe_b64encode(key.encode()).decode().rstrip("=")
    return f"base64url.bearer.authorization.k8s.io.{encoded}"


async def handshake(
    base: str, headers: dict[str, str], *, key: str | None
) -> tuple[int, str | None]:
    """Open the relayed console with `headers` (and `key`); the HTTP status and subprotocol."""
    protocols = (V5, bearer(key)) if key is not None else (V5,)
    async with aiohttp.ClientSession() as session:
        try:
            ws = await session.ws_connect(base + CONSOLE, protocols=protocols, headers=headers)
        except aiohttp.WSServerHandshakeError as exc:
            return exc.status, None
        async with ws:
            return 101, ws.protocol


async def read(base: str, path: str, headers: dict[str, str]) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(base + path, headers=headers) as r:
        return r.status, r.content_type


async def writers(demo: Demo, base: str, key: str) -> list[object]:
    """The demo console's writers, read through the relay with the key."""
    async with (
        aiohttp.ClientSession() as session,
        session.get(base + SESSIONS, headers={"Authorization": f"Bearer {key}"}) as r,
    ):
        items = (await r.json())["items"]
    return [i for i in items if i["subresource"] == "console" and i["mode"] == "writer"]


@pytest.mark.parametrize(
    ("origin", "host"),
    [
        ("http://evil.example", None),  # another site's page
        ("null", None),  # a sandboxed frame or a file
        (None, None),  # no browser at all
        ("http://rebound.example:{port}", "rebound.example:{port}"),  # DNS rebinding
    ],
)
async def test_foreign_origins_and_hosts_are_refused(
    demo: Demo, origin: str | None, host: str | None
) -> None:
    async with subres_web(demo.kubeconfig) as url:
        parts = urlsplit(url)
        base, key = f"http://{parts.netloc}", key_of(url)
        headers = {}
        if origin is not None:
            headers["Origin"] = origin.format(port=parts.port)
        if host is not None:
            headers["Host"] = host.format(port=parts.port)
        assert await handshake(base, headers, key=key) == (403, None)
        # The page's own origin gets through, with the kubeconfig's token added.
        assert await handshake(base, {"Origin": base}, key=key) == (101, V5)


async def test_a_local_process_without_the_key_gets_nothing(demo: Demo) -> None:
    """The page's own Origin and Fetch headers are anyone's to send; the key is not."""
    async with subres_web(demo.kubeconfig) as url:
        base, key = f"http://{urlsplit(url).netloc}", key_of(url)
        page = {"Origin": base, "Sec-Fetch-Site": "same-origin"}
        for wrong in (None, "", key[:-1], key + "x", key.upper()):
            assert await handshake(base, page, key=wrong) == (401, None), wrong
            headers = page if wrong is None else {**page, "Authorization": f"Bearer {wrong}"}
            for path in (SESSIONS, RECORDINGS, CONSOLE):
                assert await read(base, path, headers) == (401, "application/json"), path
        # Nothing was opened on the user's behalf.
        assert await writers(demo, base, key) == []


async def test_a_page_of_another_origin_cannot_open_the_relay(
    browser: cdp.Browser, demo: Demo
) -> None:
    async with subres_web(demo.kubeconfig) as url:
        port, key = urlsplit(url).port, key_of(url)
        page = await browser.new_page()
        await page.goto(url)
        # http://127.0.0.1:PORT and http://localhost:PORT are different origins.
        opened = """(target, protocols) => new Promise((resolve) => {
            const ws = new WebSocket(target, protocols);
            ws.onopen = () => { ws.close(); resolve('open'); };
            ws.onerror = () => resolve('refused');
        })"""
        protocols = [V5, bearer(key)]
        foreign = f"ws://localhost:{port}{CONSOLE}"
        own = f"ws://127.0.0.1:{port}{CONSOLE}"
        assert await page.evaluate(f"({opened})({foreign!r}, {protocols!r})") == "refused"
        assert await page.evaluate(f"({opened})({own!r}, {protocols!r})") == "open"


@pytest.mark.parametrize(
    "headers",
    [
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
        {"Origin": "http://evil.example"},
    ],
)
async def test_the_page_reads_who_holds_the_machine_and_no_other_site_does(
    demo: Demo, headers: dict[str, str]
) -> None:
    async with subres_web(demo.kubeconfig) as url:
        base, key = f"http://{urlsplit(url).netloc}", key_of(url)
        auth = {"Authorization": f"Bearer {key}"}
        assert await read(base, SESSIONS, {**headers, **auth}) == (403, "text/plain")
        own = {"Sec-Fetch-Site": "same-origin", **auth}
        assert await read(base, SESSIONS, own) == (200, "application/json")
        assert await read(base, RECORDINGS, own) == (200, "application/json")
        missing = CONSOLE.replace("/console", "/recordings/20240101T000000Z-00000000.cast")
        assert await read(base, missing, own) == (404, "application/json")
