"""The page's console picker: a machine with two consoles, each typed into on its own.

Each console is an echo backend that tags what it sends back, so the
terminal's buffer says which console answered.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.browser import cdp
from tests.browser.test_console import CONNECTED, TERMINAL, buffer_has
from tests.server.test_consoles import TWO_CONSOLES, tagged, two
from tests.support import Backend, Standalone, start_standalone

PICKER = "document.getElementById('consoles')"


@pytest.fixture
async def subres(tmp_path: Path, browser_ready: None) -> AsyncIterator[Standalone]:
    serials = (
        await Backend(handler=tagged(b"<zero>")).start_tcp(),
        await Backend(handler=tagged(b"<one>")).start_tcp(),
    )
    page = {"authorization_always_allow_paths": ("/readyz", "/ui", "/ui/*")}
    async with start_standalone(
        tmp_path, two("vm1", serials), config=TWO_CONSOLES, options=page
    ) as s:
        yield s
    await asyncio.gather(*(serial.stop() for serial in serials))


async def test_the_picker_connects_the_tab_to_each_console(
    browser: cdp.Browser, subres: Standalone, tmp_path: Path
) -> None:
    token = subres.auth["Authorization"].removeprefix("Bearer ")
    page = await browser.new_page()
    await page.goto(f"{subres.base}/ui/?machine=default/vm1#token={token}")
    await page.wait_for(CONNECTED)
    options = f"Array.from({PICKER}.options, (o) => o.value)"
    assert await page.wait_for(f"!{PICKER}.hidden && {options}") == ["serial0", "serial1"]
    await page.evaluate(f"{TERMINAL}.focus()")
    await page.type("first")
    await page.wait_for(buffer_has("<zero>first"))

    await page.evaluate(f"{PICKER}.value = 'serial1'; {PICKER}.dispatchEvent(new Event('change'))")
    await page.wait_for(f"{CONNECTED} && window.subres.console.unit === 'serial1'")
    await page.evaluate(f"{TERMINAL}.focus()")
    await page.type("second")
    await page.wait_for(buffer_has("<one>second"))
    assert not await page.evaluate(buffer_has("<zero>first"))  # a fresh terminal per console
    await page.screenshot(tmp_path / "picker.png")
    assert not [line for line in page.log if line.startswith("exception")]
