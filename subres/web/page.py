"""Serving the browser page: its HTML, our scripts and the vendored ones, its settings.

One set of routes under a prefix (`/ui/`), used both by the API server and by
`subres web` (a local proxy that adds the kubeconfig's credentials). Either
way the page sends the token its link carried in the fragment: a bearer
token for the API server, or the proxy's per-launch key. The page is public
static content: it holds no secret, and every answer forbids framing and
sniffing.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from aiohttp import web

__all__ = ["PREFIX", "STATIC", "PageSettings", "add_routes", "assets_built"]

PREFIX = "/ui"
STATIC = Path(__file__).parent / "static"
VENDOR_ENTRY = STATIC / "vendor" / "xterm" / "xterm.mjs"
TYPES = {
    ".html": "text/html",
    ".js": "text/javascript",
    ".mjs": "text/javascript",
    ".css": "text/css",
    ".svg": "image/svg+xml",
    ".txt": "text/plain",
    "": "text/plain",  # LICENSE files
}
HEADERS = {
    # xterm.js sets element styles at run time; everything else comes from this origin.
    "Content-Security-Policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
REPLAY_CSP = (
    # asciinema-player's terminal is WebAssembly, compiled from bytes in its bundle: the
    # replay page alone may compile WebAssembly ('wasm-unsafe-eval' allows no JS eval).
    "default-src 'self'; script-src 'self' 'wasm-unsafe-eval'; style-src 'self' "
    "'unsafe-inline'; img-src 'self' data: blob:; frame-ancestors 'none'; base-uri 'none'; "
    "form-action 'self'"
)


@dataclass(frozen=True)
class PageSettings:
    """What the page needs to know about where it runs (served as `config.json`)."""

    api_prefix: str
    """Path of the subresources' group-version, e.g. `/apis/subresources.subres.dev/v1alpha1`."""
    resource: str = "machines"
    """Plural resource of the parents the page opens."""
    types: tuple[str, ...] = ("machines", "machine")
    """Names of that type: `TYPE/NAME` in the box means a name, any other `X/NAME` a namespace,
    as in the CLI's targets."""
    namespace: str = "default"
    """Namespace of a machine named without one."""
    machine: str = ""
    """`namespace/name` to open when the page's URL names none; empty shows the picker."""


def assets_built() -> bool:
    """True when the build step has put the vendored scripts beside ours."""
    return VENDOR_ENTRY.is_file()


def add_routes(app: web.Application, settings: PageSettings) -> None:
    """Serve the page at `/ui/` (and `/ui` redirecting there)."""
    config = json.dumps(asdict(settings)).encode()

    async def redirect(request: web.Request) -> web.StreamResponse:
        raise web.HTTPFound(request.rel_url.with_path(f"{PREFIX}/").with_query(request.query))

    async def index(request: web.Request) -> web.StreamResponse:
        return _file(STATIC / "index.html")

    async def settings_json(request: web.Request) -> web.StreamResponse:
        return web.Response(body=config, content_type="application/json", headers=HEADERS)

    async def static(request: web.Request) -> web.StreamResponse:
        return _file(_resolve(request.match_info["path"]))

    app.router.add_get(PREFIX, redirect)
    app.router.add_get(f"{PREFIX}/", index)
    app.router.add_get(f"{PREFIX}/config.json", settings_json)
    app.router.add_get(f"{PREFIX}/{{path:.+}}", static)


def _resolve(path: str) -> Path:
    """The file under STATIC that `path` names; 404 for anything outside it or unknown."""
    root = STATIC.resolve()
    candidate = (root / path).resolve()
    if not candidate.is_relative_to(root) or not candidate.is_file():
        raise web.HTTPNotFound()
    return candidate


def _file(path: Path) -> web.StreamResponse:
    content_type = TYPES.get(path.suffix)
    if content_type is None:
        raise web.HTTPNotFound()
    headers = {**HEADERS, "Content-Type": f"{content_type}; charset=utf-8"}
    if path.name == "replay.html":
        headers["Content-Security-Policy"] = REPLAY_CSP
    return web.FileResponse(path, headers=headers)
