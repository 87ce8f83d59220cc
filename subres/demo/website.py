"""The demo machine's web server: something for `subres port-forward demo` to reach.

One small HTML page on 127.0.0.1 (any free port; the machine's `portForward`
names it), with the time it was served so a reload shows a fresh answer.
No access log: the demo stays quiet.
"""

from __future__ import annotations

import time

from aiohttp import web

__all__ = ["ADDRESS", "Website"]

ADDRESS = "127.0.0.1"
PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>demo machine</title></head>
<body><h1>Hello from the demo machine</h1>
<p>This page came through <code>subres port-forward</code> at {now}.</p></body></html>
"""


class Website:
    """The page on `ADDRESS`; `port` is known once started."""

    def __init__(self) -> None:
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def start(self) -> int:
        """Listen on a free port; that port."""
        app = web.Application()
        app.router.add_get("/", _page)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        await web.TCPSite(self._runner, ADDRESS, 0).start()
        self.port = int(self._runner.addresses[0][1])
        return self.port

    async def stop(self) -> None:
        """Stop listening."""
        if self._runner is not None:
            await self._runner.cleanup()


async def _page(request: web.Request) -> web.Response:
    return web.Response(text=PAGE.format(now=time.strftime("%H:%M:%S")), content_type="text/html")
