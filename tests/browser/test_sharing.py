"""The page shares a console: one writer, two observers, the holder banner, recordings played.

A standalone server in this test's event loop serves the page and three
users; its console backend echoes and keeps what reached it, so the test
sees both what every page showed and what the machine received.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.browser import cdp
from tests.browser.test_console import TERMINAL, buffer_has
from tests.consoles import Console
from tests.support import Backend, Standalone, machine, start_standalone, wait_for

CONNECTED = "document.getElementById('status').dataset.state === 'connected'"
OBSERVING = "document.getElementById('status').textContent === 'console observed (read-only)'"
CHOOSER = "document.querySelector('.chooser')"
HOLDER = "document.getElementById('holder').textContent"


@pytest.fixture
def vm() -> Console:
    return Console()


@pytest.fixture
async def subres(tmp_path: Path, vm: Console, browser_ready: None) -> AsyncIterator[Standalone]:
    console = await Backend(handler=vm.handle).start_tcp()
    vm1 = machine("vm1", console=console.url, annotations={"subres.dev/record-console": "true"})
    recordings = {"recordings": {"directory": str(tmp_path / "recordings")}}
    page = {"authorization_always_allow_paths": ("/readyz", "/ui", "/ui/*")}
    async with start_standalone(tmp_path, vm1, config={"consoles": recordings}, options=page) as s:
        yield s
    await console.stop()


def page_url(subres: Standalone, user: str) -> str:
    token = subres.auth_as(user)["Authorization"].removeprefix("Bearer ")
    return f"{subres.base}/ui/?machine=default/vm1#token={token}"


async def observer(browser: cdp.Browser, subres: Standalone, user: str) -> cdp.Page:
    page = await browser.new_page()
    await page.goto(page_url(subres, user))
    offer = await page.wait_for(f"{CHOOSER} && {CHOOSER}.textContent")
    assert offer.startswith("In use by alice since ")
    await page.evaluate(f"{CHOOSER}.querySelector('[data-mode=observer]').click()")
    await page.wait_for(OBSERVING)
    return page


async def test_one_writer_two_observers_and_the_holder_banner(
    browser: cdp.Browser, subres: Standalone, vm: Console, tmp_path: Path
) -> None:
    alice = await browser.new_page()
    await alice.goto(page_url(subres, "alice"))
    await alice.wait_for(CONNECTED)
    assert await alice.evaluate(CHOOSER) is None  # nobody held it: no question asked
    bob = await observer(browser, subres, "bob")
    carol = await observer(browser, subres, "carol")

    await alice.evaluate(f"{TERMINAL}.focus()")
    await alice.type("echo sub$((6*7))res\r")
    for page in (alice, bob, carol):
        await page.wait_for(buffer_has("echo sub$((6*7))res"))
        # Every one of them was told first that the console is recorded.
        await page.wait_for(buffer_has("[subres: this console session is recorded]"))

    # An observer's keys do nothing: the page sends none, and what is sent anyway is dropped.
    await bob.evaluate(f"{TERMINAL}.focus()")
    await bob.type("reboot\r")
    await bob.evaluate(
        "window.subres.console.ws.send("
        "new Uint8Array([0, ...new TextEncoder().encode('rm -rf /\\r')]))"
    )
    await carol.wait_for(
        f"{HOLDER}.startsWith('alice writing since ')"
        f" && {HOLDER}.endsWith('watched by bob, carol · recorded')",
        within=15,
    )
    await carol.screenshot(tmp_path / "observer.png")
    await alice.type("echo done\r")
    await carol.wait_for(buffer_has("echo done"))
    assert bytes(vm.received) == b"echo sub$((6*7))res\recho done\r"


async def test_a_recording_plays_in_asciinema_player(
    browser: cdp.Browser, subres: Standalone, tmp_path: Path
) -> None:
    page = await browser.new_page()
    await page.goto(page_url(subres, "alice"))
    await page.wait_for(CONNECTED)
    await page.evaluate(f"{TERMINAL}.focus()")
    await page.type("echo played back\r")
    await page.wait_for(buffer_has("echo played back"))
    await page.evaluate("window.subres.console.ws.close()")  # its recording is written
    await wait_for(lambda: not subres.server.state.sessions.live)
    await subres.server.state.recordings.stop()

    await page.evaluate("document.getElementById('tab-recordings').click()")
    link = "document.querySelector('#recordings a[data-recording]')"
    # Followed as a click would, but waiting for the new page (a click races its unload).
    await page.goto(await page.wait_for(f"{link} && {link}.href"))
    assert await page.evaluate("location.pathname") == "/ui/replay.html"
    await page.wait_for(
        "document.querySelector('.ap-term, .ap-terminal, pre')"
        " && document.getElementById('player').textContent.includes('echo played back')",
        within=20,
    )
    await page.screenshot(tmp_path / "replay.png")
    assert not [line for line in page.log if line.startswith("exception")]
