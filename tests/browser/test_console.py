"""The console tab: xterm.js typing into real consoles and fitting the window."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.browser import cdp
from tests.browser.conftest import Demo, subres_web
from tests.browser.fakecluster import TOKEN, fake_cluster

CONNECTED = "document.getElementById('status').dataset.state === 'connected'"
TERMINAL = "window.subres.console.terminal"


def buffer_has(text: str) -> str:
    """A page expression: does any line of the terminal's buffer contain `text`?"""
    return f"""(() => {{
        const buffer = {TERMINAL}.buffer.active;
        for (let i = 0; i < buffer.length; i++) {{
            if (buffer.getLine(i).translateToString(true).includes({text!r})) return true;
        }}
        return false;
    }})()"""


async def test_typing_in_the_demo_page_runs_a_command(
    browser: cdp.Browser, demo: Demo, tmp_path: Path
) -> None:
    page = await browser.new_page()
    await page.goto(demo.page_url)
    await page.wait_for(CONNECTED)
    # The token left the address bar as soon as the page had read it.
    assert await page.evaluate("location.hash") == ""
    assert await page.evaluate("document.getElementById('machine').textContent") == "default/demo"
    await page.type("echo sub$((6*7))res\r")
    await page.wait_for(buffer_has("sub42res"))
    await page.screenshot(tmp_path / "console.png")
    # Nothing the page asked for failed to load (a missing favicon would).
    assert [line for line in page.log if line.startswith("browser.error")] == []


@pytest.mark.parametrize(
    ("machine", "said"),
    [
        ("nope", 'Error from server (NotFound): machines.subres.dev "nope" not found'),
        ("stopped", "Error from server (Conflict): Machine default/stopped is not Running"),
    ],
)
async def test_a_refused_console_or_display_says_why_as_the_cli_does(
    browser: cdp.Browser, demo: Demo, machine: str, said: str
) -> None:
    """A browser hides why an upgrade was refused: the page asks and shows the answer."""
    page = await browser.new_page()
    await page.goto(demo.page_url.replace("machine=default/demo", f"machine={machine}"))
    status = "document.getElementById('status').textContent"
    assert said in await page.wait_for(f"{status}.includes('Error from server') && {status}")
    await page.wait_for(buffer_has(said))
    await page.evaluate("document.getElementById('tab-vnc').click()")
    assert said in await page.wait_for(f"{status}.startsWith('display:') && {status}")


async def test_the_box_reads_targets_as_the_cli_does(browser: cdp.Browser, demo: Demo) -> None:
    # TYPE/NAME with a type of the page, else NAMESPACE/NAME: the CLI's grammar.
    assert "?machine=default/demo#" in demo.page_url
    page = await browser.new_page()
    for asked, shown in (("machine/demo", "default/demo"), ("lab/vm1", "lab/vm1")):
        await page.goto(demo.page_url.replace("machine=default/demo", f"machine={asked}"))
        machine = "document.getElementById('machine').textContent"
        assert await page.wait_for(f"{machine} !== 'no machine' && {machine}") == shown


async def next_size(queue: asyncio.Queue[dict[str, Any]], size: list[int]) -> None:
    """Wait (at most 10 s) for the resize message of `size` (cols, rows)."""
    wanted = {"Width": size[0], "Height": size[1]}
    async with asyncio.timeout(10):
        while await queue.get() != wanted:
            pass


async def test_resizes_reach_the_server_through_subres_web(
    browser: cdp.Browser, tmp_path: Path
) -> None:
    async with fake_cluster() as cluster, subres_web(cluster.kubeconfig(tmp_path), "m1") as url:
        assert "/ui/?machine=lab/m1#token=" in url
        page = await browser.new_page(width=1000, height=700)
        await page.goto(url)
        await page.wait_for(CONNECTED)
        first = await page.evaluate(f"[{TERMINAL}.cols, {TERMINAL}.rows]")
        await next_size(cluster.resizes, first)

        await page.resize(600, 360)
        smaller = await page.wait_for(
            f"{TERMINAL}.cols < {first[0]} && {TERMINAL}.rows < {first[1]}"
            f" && [{TERMINAL}.cols, {TERMINAL}.rows]"
        )
        await next_size(cluster.resizes, smaller)

        await page.type("hello\r")
        await page.wait_for(buffer_has("hello"))
    # The cluster saw the kubeconfig's token; the page never offered one.
    assert cluster.authorizations == [f"Bearer {TOKEN}"]
    assert cluster.offered == ["v5.channel.k8s.io, v4.channel.k8s.io"]
    assert bytes(cluster.stdin) == b"hello\r"
