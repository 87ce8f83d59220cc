"""`subres web` lends its credentials to its own page only."""

from __future__ import annotations

from urllib.parse import urlsplit

import aiohttp
import pytest

from tests.browser import cdp
from tests.browser.conftest import Demo, subres_web

CONSOLE = "/apis/subresources.subres.dev/v1alpha1/namespaces/default/machines/demo/console"
V5 = "v5.channel.k8s.io"


async def handshake(base: str, headers: dict[str, str]) -> tuple[int, str | None]:
    """Open the relayed console with `headers`; the HTTP status and subprotocol."""
    async with aiohttp.ClientSession() as session:
        try:
            ws = await session.ws_connect(base + CONSOLE, protocols=(V5,), headers=headers)
        except aiohttp.WSServerHandshakeError as exc:
            return exc.status, None
        async with ws:
            return 101, ws.protocol


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
        base = f"http://{parts.netloc}"
        headers = {}
        if origin is not None:
            headers["Origin"] = origin.format(port=parts.port)
        if host is not None:
            headers["Host"] = host.format(port=parts.port)
        assert await handshake(base, headers) == (403, None)
        # The page's own origin gets through, with the kubeconfig's token added.
        assert await handshake(base, {"Origin": base}) == (101, V5)


async def test_a_page_of_another_origin_cannot_open_the_relay(
    browser: cdp.Browser, demo: Demo
) -> None:
    async with subres_web(demo.kubeconfig) as url:
        port = urlsplit(url).port
        page = await browser.new_page()
        await page.goto(url)
        # http://127.0.0.1:PORT and http://localhost:PORT are different origins.
        opened = """(target) => new Promise((resolve) => {
            const ws = new WebSocket(target, ['v5.channel.k8s.io']);
            ws.onopen = () => { ws.close(); resolve('open'); };
            ws.onerror = () => resolve('refused');
        })"""
        foreign = f"ws://localhost:{port}{CONSOLE}"
        own = f"ws://127.0.0.1:{port}{CONSOLE}"
        assert await page.evaluate(f"({opened})({foreign!r})") == "refused"
        assert await page.evaluate(f"({opened})({own!r})") == "open"


async def read(base: str, path: str, headers: dict[str, str]) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(base + path, headers=headers) as r:
        return r.status, r.content_type


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
    sessions = CONSOLE.replace("/console", "/sessions")
    async with subres_web(demo.kubeconfig) as url:
        base = f"http://{urlsplit(url).netloc}"
        assert await read(base, sessions, headers) == (403, "text/plain")
        own = {"Sec-Fetch-Site": "same-origin"}
        assert await read(base, sessions, own) == (200, "application/json")
        assert await read(base, CONSOLE.replace("/console", "/recordings"), own) == (
            200,
            "application/json",
        )
        missing = CONSOLE.replace("/console", "/recordings/20240101T000000Z-00000000.cast")
        assert await read(base, missing, own) == (404, "application/json")
