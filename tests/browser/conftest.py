"""Browser test fixtures: Chromium, `subres demo` and `subres web` as real processes.

Without Chromium or the page's built npm assets the tests fail, saying what is
missing: scripts/test installs both, and a skip would hide a failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from subres.web import page as web_page
from tests.browser import cdp

__all__ = ["Demo", "browser", "browser_ready", "demo", "start_subres", "subres_web"]


def _missing(reason: str) -> None:
    # Never a skip: a browser test that cannot run is a failure the reader must see.
    pytest.fail(f"{reason}; scripts/test installs it")


@pytest.fixture
def browser_ready() -> None:
    """Fail when Chromium or the page's scripts are missing."""
    if not Path(cdp.CHROMIUM).is_file():
        _missing("chromium is not installed")
    if not web_page.assets_built():
        _missing("the page's npm assets are not built (pip install -e .)")


@pytest.fixture
async def browser(browser_ready: None) -> AsyncIterator[cdp.Browser]:
    """A headless Chromium with a fresh profile."""
    async with cdp.launch() as running:
        yield running


@dataclass
class Demo:
    """A running `subres demo`: its page URL (the relay's key in the fragment), kubeconfig."""

    page_url: str
    kubeconfig: Path


@contextlib.asynccontextmanager
async def start_subres(*args: str, until: bytes) -> AsyncIterator[str]:
    """Run `python -m subres ARGS` until it prints `until`; its output so far."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "subres",
        *args,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "SHELL": "/bin/sh"},
    )
    assert proc.stdout is not None
    output = b""
    drain: asyncio.Task[None] | None = None
    try:
        async with asyncio.timeout(30):
            while until not in output:
                line = await proc.stdout.readline()
                assert line, f"subres {args[0]} exited early: {output.decode()}"
                output += line
        drain = asyncio.create_task(_drain(proc.stdout))
        yield output.decode()
    finally:
        if drain is not None:
            drain.cancel()
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(15):
                await proc.wait()


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.read(65536):
        pass


@pytest.fixture
async def demo(tmp_path: Path) -> AsyncIterator[Demo]:
    """`subres demo` on any port, as a newcomer starts it."""
    state = tmp_path / "demo"
    async with start_subres("demo", "--state-dir", str(state), "--port", "0", until=b"Try:") as out:
        match = re.search(r"page: +(http://127\.0\.0\.1:\d+/\S+#token=\S+)", out)
        assert match, out
        yield Demo(page_url=match.group(1), kubeconfig=state / "kubeconfig")


@contextlib.asynccontextmanager
async def subres_web(kubeconfig: Path, *args: str) -> AsyncIterator[str]:
    """`subres web ARGS` on any loopback port; the page URL it prints."""
    async with start_subres(
        "--kubeconfig", str(kubeconfig), "web", *args, "--port", "0", until=b"\n"
    ) as out:
        match = re.search(r"at (http://127\.0\.0\.1:\d+/\S*)", out)
        assert match, out
        yield match.group(1)
