"""The first ten minutes, as a new user spends them: install, demo, every command it prints.

A copy of the source tree (what a fresh clone holds) is installed with
`pip install .` into a fresh virtualenv; pip's own cache keeps that quick
after the first run. Its `subres demo` then runs as the user would start it,
and every command under "Try:" runs as printed, after the printed `export
KUBECONFIG=…` line: through a pipe, in a terminal, or left running while the
test uses what it serves. Only what a shared machine forces is changed: a
free local port instead of a fixed one, a viewer that exits at once instead
of a real VNC viewer. The page's link opens in Chromium, which must show a
terminal the demo's shell answers in, with nothing failing to load; and the
demo's own output must hold no other library's INFO lines.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pexpect  # type: ignore[import-untyped]
import pytest
from PIL import Image

from tests.browser import cdp
from tests.browser.conftest import browser, browser_ready
from tests.cli.conftest import read_until, running, stop

__all__ = ["browser", "browser_ready"]

ROOT = Path(__file__).resolve().parents[2]
NOT_COPIED = shutil.ignore_patterns(
    ".git", ".venv", "node_modules", "build", "dist", "*.egg-info", "__pycache__", ".*_cache",
    ".cache", ".hypothesis", "vendor",
)  # fmt: skip
"""What a fresh clone does not have: built, installed or cached files."""
INSTALL_TIMEOUT = 900
START_TIMEOUT = 60
TIMEOUT = 30
BANNER_END = rb"(?s)subres demo is serving.*Try:\n.*meant to fail[^\n]*\n"


def user_env(bin_dir: Path, home: Path, kubectl: Path) -> dict[str, str]:
    """The user's environment: the fresh install and kubectl on PATH, nothing of ours."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("KUBECONFIG", "VIRTUAL"))}
    path = os.pathsep.join([str(bin_dir), str(kubectl.parent), "/usr/bin", "/bin"])
    return keep | {"HOME": str(home), "PATH": path, "SHELL": "/bin/sh"}


@dataclass
class Newcomer:
    """A fresh install and the demo it runs."""

    env: dict[str, str]
    banner: str
    """What the demo printed on stdout, down to the last line under "Try:"."""
    log: Path
    """Where the demo's stderr goes."""

    def tries(self) -> list[str]:
        """The commands under "Try:", each with its remark (a shell comment)."""
        return [line.strip() for line in self.banner.split("Try:\n", 1)[1].splitlines()]

    def exported(self) -> str:
        match = re.search(r"^  (export KUBECONFIG=.+)$", self.banner, re.MULTILINE)
        assert match, self.banner
        return match.group(1)

    def page(self) -> str:
        match = re.search(r"^  page: +(http://127\.0\.0\.1:\d+/\S+)$", self.banner, re.MULTILINE)
        assert match, self.banner
        return match.group(1)


def _install(tmp: Path) -> Path:
    """`pip install .` from a copy of the tree, into a fresh virtualenv; its `bin`."""
    clone = tmp / "clone"
    shutil.copytree(ROOT, clone, ignore=NOT_COPIED)
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    done = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", "."],
        cwd=clone,
        capture_output=True,
        timeout=INSTALL_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-4000:]
    return venv / "bin"


@pytest.fixture(scope="module")
def newcomer(tmp_path_factory: pytest.TempPathFactory, kubectl_bin: Path) -> Iterator[Newcomer]:
    tmp = tmp_path_factory.mktemp("newcomer")
    bin_dir = _install(tmp)
    home = tmp / "home"
    home.mkdir()
    env = user_env(bin_dir, home, kubectl_bin)
    log = tmp / "demo.log"
    # As the README says, but on any free port: a shared machine may use 8443.
    argv = [str(bin_dir / "subres"), "demo", "--port", "0"]
    with log.open("wb") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, env=env)
    try:
        banner = read_until(proc, BANNER_END, timeout=START_TIMEOUT)[0].decode()
        yield Newcomer(env, banner, log)
    finally:
        stop(proc)
        assert proc.stdout is not None
        proc.stdout.close()


def shell(user: Newcomer, line: str, *, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    """`line` as the user runs it: after the export line, in sh."""
    return subprocess.run(
        ["sh", "-c", f"{user.exported()}\n{line}"],
        cwd=cwd,
        capture_output=True,
        env=user.env,
        timeout=TIMEOUT,
        check=False,
    )


def command(line: str) -> str:
    """A "Try:" line without its remark."""
    return re.sub(r"\s+# .*$", "", line)


def test_every_command_the_demo_prints_works(newcomer: Newcomer, tmp_path: Path) -> None:
    done: set[str] = set()
    for line in newcomer.tries():
        cmd = command(line)
        if "meant to fail" in line:
            result = shell(newcomer, cmd, cwd=tmp_path)
            assert result.returncode == 1 and b"(Conflict)" in result.stderr, result
        elif cmd == "subres console demo":
            _interactive_console(newcomer, cmd)
        elif " port-forward " in cmd:
            _port_forward(newcomer, cmd)
        elif cmd == "subres web demo":
            _web(newcomer, cmd)
        elif cmd == "subres vnc demo":
            viewer = shlex.quote("true {address} {port}")
            result = shell(newcomer, f"{cmd} --viewer {viewer}", cwd=tmp_path)
            assert result.returncode == 0, result
        elif cmd == "subres recordings demo":
            _recordings(newcomer, cmd, tmp_path)
        else:
            result = shell(newcomer, cmd, cwd=tmp_path)
            assert result.returncode == 0, result
            if " screenshot " in cmd:
                assert (tmp_path / "demo.png").read_bytes().startswith(b"\x89PNG")
            if cmd.startswith("echo 'uname -a'"):
                assert os.uname().sysname.encode() in result.stdout
        done.add(cmd)
    assert len(done) == len(newcomer.tries()) >= 8, newcomer.banner


def _interactive_console(user: Newcomer, cmd: str) -> None:
    child = pexpect.spawn(
        "sh", ["-c", f"{user.exported()}; {cmd}"], env=user.env, timeout=TIMEOUT,
        dimensions=(24, 80),
    )  # fmt: skip
    try:
        child.expect_exact(b"Escape with Ctrl+]")
        child.sendline("echo typed-$((40+2))")
        child.expect_exact(b"typed-42")
        child.send(b"\x1d")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
    assert b"can't access tty" not in child.before


def _port_forward(user: Newcomer, cmd: str) -> None:
    # 8080 may be taken on a shared machine: any free local port instead.
    argv = ["sh", "-c", f"{user.exported()}; exec {cmd.replace(' 8080:', ' 0:')}"]
    with running(argv, env=user.env) as proc:
        local = read_until(proc, rb"Forwarding from 127\.0\.0\.1:(\d+) ", timeout=TIMEOUT)
        with urllib.request.urlopen(f"http://localhost:{int(local[1])}/", timeout=TIMEOUT) as r:
            assert b"Hello from the demo machine" in r.read()


def _web(user: Newcomer, cmd: str) -> None:
    argv = ["sh", "-c", f"{user.exported()}; exec {cmd} --port 0"]
    with running(argv, env=user.env) as proc:
        page = read_until(proc, rb"at (http://127\.0\.0\.1:\d+/ui/\S*)", timeout=TIMEOUT)
        with urllib.request.urlopen(page[1].decode(), timeout=TIMEOUT) as r:
            assert b"<html" in r.read()


def _recordings(user: Newcomer, cmd: str, cwd: Path) -> None:
    """The sessions so far were recorded; the hint it prints plays the newest."""
    listed = shell(user, cmd, cwd=cwd)
    assert listed.returncode == 0, listed
    assert b".cast" in listed.stdout
    hint = listed.stderr.decode()
    assert hint.startswith("Play the newest: "), hint
    played = shell(user, hint.removeprefix("Play the newest: ").strip(), cwd=cwd)
    assert played.returncode == 0, played
    assert b"uname -a" in played.stdout  # the newest: the piped example's session


async def test_the_page_shows_a_terminal_the_shell_answers_in(
    newcomer: Newcomer, browser: cdp.Browser, tmp_path: Path
) -> None:
    page = await browser.new_page(width=1000, height=700)
    await page.goto(newcomer.page())
    await page.wait_for("document.getElementById('status').dataset.state === 'connected'")
    await page.type("echo page-$((6*7))\r")
    await page.wait_for(_buffer_has("page-42"))
    box = await page.evaluate(
        "(() => { const r = document.getElementById('console').getBoundingClientRect();"
        " return {x: r.x, y: r.y, width: r.width, height: r.height}; })()"
    )
    shot = tmp_path / "terminal.png"
    await page.screenshot(shot, clip=box)
    _looks_like_a_terminal(Image.open(shot))
    assert [line for line in page.log if line.startswith(("browser.error", "exception"))] == []


def _buffer_has(text: str) -> str:
    return f"""(() => {{
        const buffer = window.subres.console.terminal.buffer.active;
        for (let i = 0; i < buffer.length; i++) {{
            if (buffer.getLine(i).translateToString(true).includes({text!r})) return true;
        }}
        return false;
    }})()"""


def _looks_like_a_terminal(image: Image.Image) -> None:
    """Mostly the terminal's black, with light text on it: a terminal, not a blank or an error."""
    data = image.convert("RGB").tobytes()
    pixels = [data[i : i + 3] for i in range(0, len(data), 3)]
    black = sum(1 for p in pixels if max(p) < 16)
    light = sum(1 for p in pixels if min(p) > 160)
    assert black > len(pixels) // 2, f"{black} of {len(pixels)} pixels are the background"
    assert light > 100, f"only {light} light pixels: no text"


def test_the_demo_says_nothing_it_need_not(newcomer: Newcomer) -> None:
    """Its log holds subres's own lines; other libraries' INFO lines only come with -v."""
    log = newcomer.log.read_text()
    noise = [line for line in log.splitlines() if " INFO " in line and " subres." not in line]
    assert noise == []
    assert "Traceback" not in log
