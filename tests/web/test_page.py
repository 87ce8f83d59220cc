"""The page's routes: what they serve, with which types and headers, and what they refuse."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from subres.web import page

SETTINGS = page.PageSettings(api_prefix="/apis/g.example/v1", machine="lab/m1")


@pytest.fixture
async def client() -> AsyncIterator[TestClient[web.Request, web.Application]]:
    app = web.Application()
    page.add_routes(app, SETTINGS)
    async with TestClient(TestServer(app, host="127.0.0.1")) as test_client:
        yield test_client


async def test_the_page_and_its_settings(client: TestClient[web.Request, web.Application]) -> None:
    moved = await client.get("/ui?machine=a/b", allow_redirects=False)
    assert (moved.status, moved.headers["Location"]) == (302, "/ui/?machine=a/b")
    index = await client.get("/ui/")
    assert index.status == 200
    assert index.headers["Content-Type"] == "text/html; charset=utf-8"
    assert "frame-ancestors 'none'" in index.headers["Content-Security-Policy"]
    assert index.headers["X-Content-Type-Options"] == "nosniff"
    assert '<script type="module" src="app.js">' in await index.text()
    settings = await (await client.get("/ui/config.json")).json()
    assert settings == {
        "api_prefix": "/apis/g.example/v1",
        "resource": "machines",
        "types": ["machines", "machine"],
        "namespace": "default",
        "machine": "lab/m1",
    }


async def test_both_pages_name_their_icon(
    client: TestClient[web.Request, web.Application],
) -> None:
    """A page without an icon makes the browser ask for /favicon.ico, a 404 in its console."""
    for path in ("/ui/", "/ui/replay.html"):
        assert '<link rel="icon" href="favicon.svg"' in await (await client.get(path)).text()
    icon = await client.get("/ui/favicon.svg")
    assert icon.status == 200
    assert icon.headers["Content-Type"] == "image/svg+xml; charset=utf-8"


async def test_scripts_are_javascript(client: TestClient[web.Request, web.Application]) -> None:
    for path in ("/ui/app.js", "/ui/console.js", "/ui/vnc.js", "/ui/errors.js"):
        answer = await client.get(path)
        assert answer.headers["Content-Type"] == "text/javascript; charset=utf-8", path
    if page.assets_built():
        vendored = await client.get("/ui/vendor/xterm/xterm.mjs")
        assert vendored.headers["Content-Type"] == "text/javascript; charset=utf-8"


@pytest.mark.parametrize(
    "path",
    ["/ui/../page.py", "/ui/%2e%2e/page.py", "/ui/missing.js", "/ui/vendor/xterm/xterm.mjs.map"],
)
async def test_nothing_else_is_served(
    client: TestClient[web.Request, web.Application], path: str
) -> None:
    assert (await client.get(path)).status == 404
