"""Build step for the browser page: its third-party JavaScript from npm.

`package.json` and `package-lock.json` pin xterm.js, its fit addon, noVNC and
asciinema-player (its self-contained bundle: the recordings page);
`build_py` runs `npm ci` and copies only the files the page loads (with their
licences) into `subres/web/static/vendor/`. Regular builds write them into the
build directory, so wheels carry them; editable installs write them into the
source tree (git-ignored), which is where an editable install reads from.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
VENDOR = Path("subres", "web", "static", "vendor")
FILES = {
    "xterm/xterm.mjs": "@xterm/xterm/lib/xterm.mjs",
    "xterm/xterm.css": "@xterm/xterm/css/xterm.css",
    "xterm/LICENSE": "@xterm/xterm/LICENSE",
    "addon-fit/addon-fit.mjs": "@xterm/addon-fit/lib/addon-fit.mjs",
    "addon-fit/LICENSE": "@xterm/addon-fit/LICENSE",
    "novnc/LICENSE.txt": "@novnc/novnc/LICENSE.txt",
    "asciinema-player/asciinema-player.min.js": (
        "asciinema-player/dist/bundle/asciinema-player.min.js"
    ),
    "asciinema-player/asciinema-player.css": "asciinema-player/dist/bundle/asciinema-player.css",
    "asciinema-player/LICENSE": "asciinema-player/LICENSE",
}
TREES = {
    # noVNC's ES modules import pako from ../vendor, so the two keep their layout.
    "novnc/core": "@novnc/novnc/core",
    "novnc/vendor/pako": "@novnc/novnc/vendor/pako",
}


class BuildPyWithWebAssets(build_py):
    """`build_py` that also vendors the page's npm packages."""

    def run(self) -> None:
        target = ROOT / VENDOR if self.editable_mode else Path(self.build_lib) / VENDOR
        vendor_web_assets(target)
        super().run()


def vendor_web_assets(target: Path) -> None:
    """Install the locked npm packages and copy what the page needs to `target`."""
    if shutil.which("npm") is None:
        raise SystemExit("building subres needs npm (Node.js) for the browser page's assets")
    subprocess.run(
        ["npm", "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=ROOT,
        check=True,
    )
    modules = ROOT / "node_modules"
    shutil.rmtree(target, ignore_errors=True)
    for dest, source in FILES.items():
        (target / dest).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(modules / source, target / dest)
    for dest, source in TREES.items():
        shutil.copytree(modules / source, target / dest, ignore=shutil.ignore_patterns("*.md"))


setup(cmdclass={"build_py": BuildPyWithWebAssets})
