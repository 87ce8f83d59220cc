"""The page as a newcomer meets it when something is refused: the CLI's exact words, and
an offer to reconnect only where reconnecting can help."""

from __future__ import annotations

import time
from pathlib import Path

import yaml

from tests.browser import cdp
from tests.browser.conftest import Demo, browser, browser_ready, demo
from tests.cli.conftest import CLI_TIMEOUT, DEAD_PORT, run_cli_async

__all__ = ["browser", "browser_ready", "demo"]

STATUS = "document.getElementById('status').textContent"
DEAD = {
    "apiVersion": "subres.dev/v1alpha1",
    "kind": "Machine",
    "metadata": {"name": "dead", "namespace": "default"},
    "status": {
        "phase": "Running",
        "console": {"endpoint": f"tcp://127.0.0.1:{DEAD_PORT}"},
        "vnc": {"endpoint": f"tcp://127.0.0.1:{DEAD_PORT}"},
    },
}


def buffer_line_with(text: str) -> str:
    """A page expression: the terminal's first line holding `text`, or false."""
    return f"""(() => {{
        const buffer = window.subres.console.terminal.buffer.active;
        for (let i = 0; i < buffer.length; i++) {{
            const line = buffer.getLine(i).translateToString(true);
            if (line.includes({text!r})) return line;
        }}
        return false;
    }})()"""


async def test_a_refusing_backend_is_shown_in_the_clis_words(
    browser: cdp.Browser, demo: Demo, tmp_path: Path
) -> None:
    machines = demo.kubeconfig.parent / "machines.yaml"
    machines.write_text(machines.read_text() + "---\n" + yaml.safe_dump(DEAD))
    cluster = ["--kubeconfig", str(demo.kubeconfig)]
    deadline = time.monotonic() + CLI_TIMEOUT
    # The demo re-reads its file on its own clock; nothing tells this test.
    while (await run_cli_async([*cluster, "sessions", "dead"], home=tmp_path)).returncode:
        assert time.monotonic() < deadline
    console = await run_cli_async([*cluster, "console", "dead"], home=tmp_path)
    viewer = ["--viewer", "true {address} {port}"]
    display = await run_cli_async([*cluster, "vnc", "dead", *viewer], home=tmp_path)
    said = console.stderr.decode().splitlines()[0]  # a hint about --timeout follows
    assert console.returncode == display.returncode == 1
    assert said.startswith("Error from server (ServiceUnavailable): "), said
    page = await browser.new_page()
    await page.goto(demo.page_url.replace("machine=default/demo", "machine=dead"))
    assert await page.wait_for(f"{STATUS}.includes('Error from server') && {STATUS}") == (
        f"console: {said}"
    )
    # A backend may come up: the offer to reconnect stays (the terminal wraps the line).
    await page.wait_for(buffer_line_with(f"[{said[:60]}"))
    await page.wait_for(buffer_line_with("; press Enter to reconnect]"))
    await page.evaluate("document.getElementById('tab-vnc').click()")
    shown = await page.wait_for(f"{STATUS}.startsWith('display: ') && {STATUS}")
    assert shown == f"display: {display.stderr.decode().splitlines()[0]}; click to reconnect"


async def test_a_page_without_the_key_says_so_and_offers_no_reconnect(
    browser: cdp.Browser, demo: Demo
) -> None:
    said = (
        "Error from server (Unauthorized): "
        "this page needs the key in the link subres printed: open that link"
    )
    page = await browser.new_page()
    await page.goto(demo.page_url.split("#token=")[0] + "#token=not-the-key")
    assert await page.wait_for(f"{STATUS}.startsWith('console: ') && {STATUS}") == (
        f"console: {said}"
    )
    assert await page.wait_for(buffer_line_with(said)) == f"[{said}]"
    # Enter, which would reconnect after a lost connection, does nothing here.
    await page.evaluate("window.refused = window.subres.console.ws")
    await page.type("\r")
    assert await page.evaluate("window.subres.console.ws === window.refused")
    await page.evaluate("document.getElementById('tab-vnc').click()")
    shown = await page.wait_for(f"{STATUS}.startsWith('display: ') && {STATUS}")
    assert shown == f"display: {said}"
