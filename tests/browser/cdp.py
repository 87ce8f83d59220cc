"""Headless Chromium driven over the Chrome DevTools protocol, from Python.

Just what the page tests need: launch Debian's chromium with a fresh profile,
open a tab, navigate, evaluate JavaScript, wait on a page condition with a
bound, type, resize the viewport and take screenshots. The DevTools endpoint
listens on 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

__all__ = ["CHROMIUM", "Browser", "CdpError", "Page", "launch"]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
)
LISTENING = re.compile(rb"DevTools listening on (ws://\S+)")


class CdpError(Exception):
    """A DevTools command failed, or a page condition did not hold in time."""


class Browser:
    """One Chromium process and its DevTools connection."""

    def __init__(self, ws: ClientConnection) -> None:
        self._ws = ws
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._pages: dict[str, Page] = {}
        self._reader = asyncio.create_task(self._read())

    async def send(
        self, method: str, params: dict[str, Any] | None = None, *, session: str | None = None
    ) -> dict[str, Any]:
        """Run one command (in a tab's session when given); its result."""
        ident = next(self._ids)
        message: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        future = asyncio.get_running_loop().create_future()
        self._pending[ident] = future
        await self._ws.send(json.dumps(message))
        async with asyncio.timeout(30):
            result: dict[str, Any] = await future
        return result

    async def _read(self) -> None:
        async for raw in self._ws:
            message = json.loads(raw)
            if "id" not in message:
                page = self._pages.get(message.get("sessionId", ""))
                if page is not None:
                    page.record(message["method"], message.get("params", {}))
                continue
            future = self._pending.pop(message["id"], None)
            if future is None or future.done():
                continue
            if "error" in message:
                future.set_exception(CdpError(f"{message['error']}"))
            else:
                future.set_result(message.get("result", {}))

    async def new_page(self, *, width: int = 1000, height: int = 700) -> Page:
        """A fresh tab with a `width` by `height` viewport."""
        target = await self.send("Target.createTarget", {"url": "about:blank"})
        attached = await self.send(
            "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}
        )
        tab = self._pages[attached["sessionId"]] = Page(self, attached["sessionId"])
        await tab.send("Runtime.enable")
        await tab.send("Log.enable")  # what the browser itself says: failed loads, CSP
        await tab.resize(width, height)
        return tab

    async def close(self) -> None:
        """End the DevTools connection."""
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
        await self._ws.close()


class Page:
    """One tab."""

    def __init__(self, browser: Browser, session: str) -> None:
        self._browser = browser
        self._session = session
        self.log: list[str] = []
        """The page's console messages, uncaught exceptions and the browser's own entries
        (a resource that failed to load), for failure reports and checks."""

    def record(self, method: str, params: dict[str, Any]) -> None:
        """Keep what the page logged or threw."""
        if method == "Runtime.consoleAPICalled":
            args = " ".join(str(a.get("value", a.get("description", ""))) for a in params["args"])
            self.log.append(f"console.{params['type']}: {args}")
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            self.log.append(f"exception: {details.get('exception', {}).get('description')}")
        elif method == "Log.entryAdded":
            entry = params["entry"]
            self.log.append(f"browser.{entry['level']}: {entry['text']} {entry.get('url', '')}")

    async def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Run one command in this tab."""
        return await self._browser.send(method, params, session=self._session)

    async def goto(self, url: str) -> None:
        """Navigate and wait for the document to finish loading."""
        result = await self.send("Page.navigate", {"url": url})
        if result.get("errorText"):
            raise CdpError(f"cannot load {url}: {result['errorText']}")
        await self.wait_for("document.readyState === 'complete'")

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression (promises awaited)."""
        result = await self.send(
            "Runtime.evaluate",
            {"expression": expression, "awaitPromise": True, "returnByValue": True},
        )
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise CdpError(f"{text}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, *, within: float = 10.0) -> Any:
        """Wait (in the page, at most `within` s) until `expression` is truthy; its value."""
        script = f"""new Promise((resolve, reject) => {{
            const deadline = performance.now() + {within * 1000};
            const check = () => {{
                let value;
                try {{ value = ({expression}); }} catch (error) {{ value = undefined; }}
                if (value) resolve(value);
                else if (performance.now() > deadline) reject(new Error('timed out'));
                else setTimeout(check, 20);
            }};
            check();
        }})"""
        try:
            return await self.evaluate(script)
        except CdpError:
            log = "\n".join(self.log[-20:])
            message = f"waited {within} s for {expression}; the page logged:\n{log}"
            raise CdpError(message) from None

    async def type(self, text: str) -> None:
        """Type `text` into the focused element; `\\r` presses Enter."""
        for part in re.split(r"(\r)", text):
            if part == "\r":
                key = {"key": "Enter", "code": "Enter", "windowsVirtualKeyCode": 13}
                await self.send("Input.dispatchKeyEvent", {"type": "keyDown", **key, "text": "\r"})
                await self.send("Input.dispatchKeyEvent", {"type": "keyUp", **key})
            elif part:
                await self.send("Input.insertText", {"text": part})

    async def resize(self, width: int, height: int) -> None:
        """Set the viewport size (the window's inner size, as a user resizing it)."""
        metrics = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}
        await self.send("Emulation.setDeviceMetricsOverride", metrics)

    async def screenshot(self, path: Path, *, clip: dict[str, float] | None = None) -> bytes:
        """A PNG of the viewport, or of `clip` (x, y, width, height in CSS px), saved to `path`."""
        params: dict[str, Any] = {"format": "png"}
        if clip is not None:
            params["clip"] = {**clip, "scale": 1}
        result = await self.send("Page.captureScreenshot", params)
        png = base64.b64decode(result["data"])
        await asyncio.to_thread(path.write_bytes, png)
        return png


@contextlib.asynccontextmanager
async def launch() -> AsyncIterator[Browser]:
    """Start Chromium with a fresh profile; stop it (by its PID) afterwards."""
    with tempfile.TemporaryDirectory(prefix="subres-chromium-") as profile:
        proc = await asyncio.create_subprocess_exec(
            CHROMIUM,
            *FLAGS,
            f"--user-data-dir={profile}",
            "about:blank",
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its helpers too are ours to stop (see _stop)
        )
        assert proc.stderr is not None
        drain: asyncio.Task[None] | None = None
        try:
            url = await _endpoint(proc.stderr)
            drain = asyncio.create_task(_drain(proc.stderr))
            async with connect(url, max_size=None) as ws:
                browser = Browser(ws)
                await browser.send("Security.setIgnoreCertificateErrors", {"ignore": True})
                try:
                    yield browser
                finally:
                    await browser.close()
        finally:
            await _stop(proc)
            if drain is not None:
                drain.cancel()


async def _stop(proc: asyncio.subprocess.Process) -> None:
    """Stop Chromium and every helper it started, before its profile is removed.

    Its network and crash-report helpers outlive the browser for a moment and
    still write into the profile (CI once failed removing it: "Directory not empty").
    """
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    async with asyncio.timeout(15):
        await proc.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
            # Nothing tells us when processes that are not our children exit: ask (signal 0
            # only asks) until the group is empty, within the timeout above.
            while True:
                os.killpg(proc.pid, 0)
                await asyncio.sleep(0.05)


async def _endpoint(stderr: asyncio.StreamReader) -> str:
    """The browser's DevTools WebSocket URL, from the line Chromium prints at start."""
    seen = b""
    async with asyncio.timeout(30):
        while line := await stderr.readline():
            seen += line
            match = LISTENING.search(line)
            if match:
                return match.group(1).decode()
    raise CdpError(f"chromium did not start: {seen.decode(errors='replace')}")


async def _drain(stderr: asyncio.StreamReader) -> None:
    # Chromium keeps logging; an unread pipe would block it once full.
    while await stderr.read(65536):
        pass
