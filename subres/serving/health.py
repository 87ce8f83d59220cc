"""`/healthz`, `/livez` and `/readyz` in kube-apiserver's format.

Plain `ok` when every check passes; `?verbose` lists each check as `[+]name ok`;
a failing check answers 500 and names itself with `[-]name failed`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web

__all__ = ["Checks", "handler"]

Checks = Mapping[str, Callable[[], bool]]


def handler(
    endpoint: str, checks: Checks
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """A handler for `/{endpoint}` and `/{endpoint}/{check}`."""

    async def handle(request: web.Request) -> web.StreamResponse:
        only = request.match_info.get("check")
        if only is not None and only not in checks:
            raise web.HTTPNotFound(text=f"no such check {only!r}")
        selected = {n: c for n, c in checks.items() if only in (None, n)}
        results = {name: check() for name, check in selected.items()}
        passed = all(results.values())
        verbose = "verbose" in request.query or not passed
        lines = [
            f"[+]{n} ok" if ok else f"[-]{n} failed: reason withheld" for n, ok in results.items()
        ]
        verdict = f"{endpoint} check {'passed' if passed else 'failed'}"
        text = "\n".join([*lines, verdict]) + "\n" if verbose else "ok"
        return web.Response(
            status=200 if passed else 500,
            text=text,
            headers={"X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"},
        )

    return handle
