"""The VNC tab: noVNC draws the demo machine's display, pixel for pixel."""

from __future__ import annotations

import io
from pathlib import Path

from PIL import Image

from subres.demo.vnc import Display
from tests.browser import cdp
from tests.browser.conftest import Demo, subres_web

VNC_CONNECTED = (
    "document.getElementById('status').dataset.state === 'connected'"
    " && document.getElementById('status').textContent.startsWith('display')"
)
CANVAS = "document.querySelector('#vnc canvas')"
TOP_LEFT_DRAWN = (
    f"{CANVAS} && {CANVAS}.width === 640"
    f" && {CANVAS}.getContext('2d').getImageData(0, 0, 1, 1).data.join() === '0,0,255,255'"
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


async def test_vnc_tab_shows_the_demo_display(
    browser: cdp.Browser, demo: Demo, tmp_path: Path
) -> None:
    page = await browser.new_page(width=1000, height=700)
    await page.goto(demo.page_url)
    assert_shows_demo_display(await show_display(page, tmp_path))


async def test_vnc_through_subres_web_with_kubeconfig_credentials(
    browser: cdp.Browser, demo: Demo, tmp_path: Path
) -> None:
    async with subres_web(demo.kubeconfig, "machine/demo") as url:
        page = await browser.new_page(width=1000, height=700)
        await page.goto(url)
        assert_shows_demo_display(await show_display(page, tmp_path))
