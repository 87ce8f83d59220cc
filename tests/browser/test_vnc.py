"""The VNC tab: noVNC draws the demo machine's display, pixel for pixel."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import sys
from collections.abc import Iterator
from pathlib import Path

from PIL import Image

from subres.demo.vnc import Display
from tests.browser import cdp
from tests.browser.conftest import Demo, subres_web
from tests.cli.conftest import CLI_TIMEOUT, cli, cli_env, read_until, running
from tests.cli.test_vnc import check_demo_picture

VNC_CONNECTED = (
    "document.getElementById('status').dataset.state === 'connected'"
    " && document.getElementById('status').textContent.startsWith('display')"
)
CANVAS = "document.querySelector('#vnc canvas')"
TOP_LEFT_DRAWN = (
    f"{CANVAS} && {CANVAS}.width === 640"
    f" && {CANVAS}.getContext('2d').getImageData(0, 0, 1, 1).data.join() === '0,0,255,255'"
)


CLOCK_PIXELS = (
    f"Array.from({CANVAS}.getContext('2d').getImageData(...{list(Display().clock_area)}).data)"
    ".join()"
)


async def show_display(page: cdp.Page, tmp_path: Path) -> Image.Image:
    """Open the VNC tab, wait for the picture, and screenshot the canvas at 1:1."""
    await page.wait_for("!!window.subres")
    await page.evaluate("document.getElementById('tab-vnc').click()")
    await page.wait_for(VNC_CONNECTED)
    # Unscaled, so the screenshot's pixels are the framebuffer's.
    await page.evaluate("window.subres.vnc.rfb.scaleViewport = false")
    await page.wait_for(TOP_LEFT_DRAWN)
    rect = await page.evaluate(
        f"(() => {{ const r = {CANVAS}.getBoundingClientRect();"
        " return {x: r.x, y: r.y, width: r.width, height: r.height}; })()"
    )
    await page.screenshot(tmp_path / "vnc-page.png")
    shot = await page.screenshot(tmp_path / "vnc-canvas.png", clip=rect)
    return Image.open(io.BytesIO(shot)).convert("RGB")


def assert_shows_demo_display(image: Image.Image) -> None:
    """The still part of the demo's picture (all but the clock) is on screen."""
    expected = Display(clock=lambda: "")
    still_height = expected.clock_area[1]
    assert image.size == (expected.width, expected.height)
    shown = image.crop((0, 0, expected.width, still_height)).tobytes()
    wanted = expected.region(0, 0, expected.width, still_height)
    off = sum(1 for a, b in zip(shown, wanted, strict=True) if abs(a - b) > 2)
    assert off < len(wanted) // 100, f"{off} of {len(wanted)} colour values differ"


async def demo_display_page(browser: cdp.Browser, demo: Demo, tmp_path: Path) -> cdp.Page:
    """A page showing the demo's display in its VNC tab (checked)."""
    page = await browser.new_page(width=1000, height=700)
    await page.goto(demo.page_url)
    assert_shows_demo_display(await show_display(page, tmp_path))
    return page


async def test_vnc_tab_shows_the_demo_display(
    browser: cdp.Browser, demo: Demo, tmp_path: Path
) -> None:
    await demo_display_page(browser, demo, tmp_path)


async def test_vnc_through_subres_web_with_kubeconfig_credentials(
    browser: cdp.Browser, demo: Demo, tmp_path: Path
) -> None:
    async with subres_web(demo.kubeconfig, "machine/demo") as url:
        page = await browser.new_page(width=1000, height=700)
        await page.goto(url)
        assert_shows_demo_display(await show_display(page, tmp_path))


@contextlib.contextmanager
def subres_vnc(demo: Demo, home: Path, *flags: str) -> Iterator[int]:
    """`subres vnc demo --proxy-only FLAGS`: its local port."""
    argv = cli("--kubeconfig", demo.kubeconfig, "vnc", "demo", "--proxy-only", *flags)
    with running(argv, env=cli_env(home)) as proc:
        line = read_until(proc, rb"\{.*\}\n", timeout=CLI_TIMEOUT).group(0)
        yield int(json.loads(line)["port"])


async def capture(port: int, out: Path) -> Image.Image:
    """What vncdotool, a third-party viewer, sees through `subres vnc`."""
    vncdo = "from vncdotool.command import vncdo; vncdo()"
    done = await asyncio.create_subprocess_exec(
        sys.executable, "-c", vncdo, "-s", f"127.0.0.1::{port}", "capture", str(out),
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    async with asyncio.timeout(CLI_TIMEOUT):
        _, err = await done.communicate()
    assert done.returncode == 0, err
    return Image.open(out)


async def test_novnc_and_subres_vnc_view_one_display_at_once(
    browser: cdp.Browser, demo: Demo, tmp_path: Path
) -> None:
    page = await demo_display_page(browser, demo, tmp_path)
    # A view-only viewer joins through subres vnc; the page's viewer is not taken over.
    with subres_vnc(demo, tmp_path, "--view-only") as port:
        check_demo_picture(await capture(port, tmp_path / "view-only.png"))
    await page.wait_for(VNC_CONNECTED)
    # And it still receives: the clock's next tick is drawn on the page's canvas.
    await page.evaluate(f"window.clockBefore = {CLOCK_PIXELS}")
    await page.wait_for(f"{CLOCK_PIXELS} !== window.clockBefore")


async def test_the_page_views_only_while_subres_vnc_holds_the_display(
    browser: cdp.Browser, demo: Demo, tmp_path: Path
) -> None:
    with subres_vnc(demo, tmp_path) as port:
        # subres vnc holds the display once a viewer connects (it dials per viewer).
        viewer, held = await asyncio.open_connection("127.0.0.1", port)
        async with asyncio.timeout(CLI_TIMEOUT):
            assert (await viewer.readexactly(12)).startswith(b"RFB ")
        page = await browser.new_page(width=1000, height=700)
        await page.goto(demo.page_url)
        await page.wait_for("!!window.subres")
        await page.evaluate("document.getElementById('tab-vnc').click()")
        chooser = "document.querySelector('#vnc .chooser')"
        assert (await page.wait_for(f"{chooser} && {chooser}.textContent")).startswith(
            "In use by demo since "
        )
        await page.evaluate(f"{chooser}.querySelector('[data-mode=observer]').click()")
        await page.wait_for(VNC_CONNECTED)
        assert "view-only" in await page.evaluate("document.getElementById('status').textContent")
        await page.evaluate("window.subres.vnc.rfb.scaleViewport = false")
        await page.wait_for(TOP_LEFT_DRAWN)
        check_demo_picture(await capture(port, tmp_path / "interactive.png"))
        await page.wait_for(VNC_CONNECTED)
        held.close()
