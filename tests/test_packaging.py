"""Building and installing subres with Python alone: no Node.js, no npm, and offline once built.

setup.py takes the browser page's third-party files from the tarballs
package-lock.json pins (URL and sha512), never from npm. These tests build
with ``npm`` and ``node`` replaced by programs that fail loudly, check the
integrity check and the offline message, and install the wheel ``python -m
build`` makes (from its sdist, with the npm registry unreachable) into a
fresh virtualenv from local files only, then serve the page's files from it.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from aiohttp import web

REPO = Path(__file__).resolve().parent.parent
VENDOR = REPO / "subres" / "web" / "static" / "vendor"
UNREACHABLE = "http://127.0.0.1:9"
"""A proxy nobody listens on: what goes through it fails at once, as offline."""


def load_setup() -> ModuleType:
    spec = importlib.util.spec_from_file_location("subres_setup", REPO / "setup.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def no_node(tmp_path: Path) -> Iterator[dict[str, str]]:
    """An environment whose npm and node fail and write down that they were called."""
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    called = tmp_path / "called"
    for name in ("npm", "node", "npx"):
        (stubs / name).write_text(f"#!/bin/sh\necho {name} >> {called}\nexit 1\n")
        (stubs / name).chmod(0o755)
    yield {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}"}
    assert not called.exists(), f"the build ran {called.read_text()}"


def source_copy(into: Path) -> Path:
    """The checkout's files that git knows or would add, without node_modules or vendor/."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        if (REPO / name).is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, into / name)
    assert not (into / "node_modules").exists() and not (into / VENDOR.relative_to(REPO)).exists()
    return into


def test_vendored_files_come_from_the_locked_tarballs(tmp_path: Path) -> None:
    setup = load_setup()
    root = tmp_path / "root"
    root.mkdir()
    shutil.copy(REPO / "package-lock.json", root)
    setup.vendor_web_assets(tmp_path / "vendor", root=root)
    made = {p.relative_to(tmp_path / "vendor") for p in (tmp_path / "vendor").rglob("*")}
    assert Path("xterm/xterm.mjs") in made and Path("novnc/core/rfb.js") in made
    assert Path("asciinema-player/LICENSE") in made
    assert not any(p.suffix == ".md" for p in made)
    for path in made:
        if (tmp_path / "vendor" / path).is_file() and path.name != setup.STAMP:
            assert (tmp_path / "vendor" / path).read_bytes() == (VENDOR / path).read_bytes()


def test_a_tarball_that_does_not_match_the_lock_is_refused(tmp_path: Path) -> None:
    setup = load_setup()
    served = {"count": 0}

    async def tampered(request: web.Request) -> web.Response:
        served["count"] += 1
        return web.Response(body=b"not the package the lock names")

    async def run() -> None:
        app = web.Application()
        app.router.add_get("/{name:.*}", tampered)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        lock = json.loads((REPO / "package-lock.json").read_text())
        for entry in lock["packages"].values():
            if "resolved" in entry:
                entry["resolved"] = f"http://127.0.0.1:{port}/{entry['resolved'].rsplit('/')[-1]}"
        root = tmp_path / "root"
        root.mkdir()
        (root / "package-lock.json").write_text(json.dumps(lock))
        try:
            with pytest.raises(SystemExit) as refused:
                await asyncio.to_thread(
                    setup.vendor_web_assets, tmp_path / "vendor", root=root, cache=tmp_path / "c"
                )
        finally:
            await runner.cleanup()
        assert "does not match package-lock.json's integrity" in str(refused.value)
        assert not (tmp_path / "c").exists() or not any((tmp_path / "c").iterdir())

    asyncio.run(run())
    assert served["count"] == 1


def test_offline_with_nothing_cached_the_build_says_so_in_one_line(
    tmp_path: Path, no_node: dict[str, str]
) -> None:
    src = source_copy(tmp_path / "src")
    env = {**no_node, "SUBRES_CACHE": str(tmp_path / "empty"), "https_proxy": UNREACHABLE,
           "HTTPS_PROXY": UNREACHABLE}  # fmt: skip
    env.pop("NO_PROXY", None)
    env.pop("no_proxy", None)
    code = (
        "import sys, importlib.util\n"
        "spec = importlib.util.spec_from_file_location('s', 'setup.py')\n"
        "m = importlib.util.module_from_spec(spec); sys.modules['s'] = m\n"
        "spec.loader.exec_module(m)\n"
        "m.vendor_web_assets(m.ROOT / m.VENDOR)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=src,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("error: building subres needs @")
    assert "cannot download https://registry.npmjs.org/" in line
    assert "build from subres's sdist, which carries it" in line


@pytest.mark.timeout(600)
def test_python_build_makes_a_wheel_that_installs_offline_into_a_fresh_venv(
    tmp_path: Path, no_node: dict[str, str]
) -> None:
    src = source_copy(tmp_path / "src")
    dist = tmp_path / "dist"
    # The sdist, from the tarballs in the cache (the editable install of the suite put them there).
    build = [sys.executable, "-m", "build", "--outdir", str(dist)]
    subprocess.run([*build, "--sdist", str(src)], env=no_node, check=True, capture_output=True)
    [sdist] = dist.glob("subres-*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = archive.getnames()
        archive.extractall(tmp_path / "unpacked", filter="data")
    assert any(n.endswith("static/vendor/xterm/xterm.mjs") for n in names)
    # The wheel, from the sdist alone: no cache, and the npm registry out of reach.
    offline_npm = {**no_node, "SUBRES_CACHE": str(tmp_path / "empty"), "https_proxy": UNREACHABLE,
                   "no_proxy": "pypi.org,files.pythonhosted.org"}  # fmt: skip
    [unpacked] = (tmp_path / "unpacked").iterdir()
    subprocess.run([*build, "--wheel", str(unpacked)], env=offline_npm, check=True)
    [wheel] = dist.glob("subres-*.whl")
    # Its Python dependencies as local files, then a fresh venv that sees no index.
    deps = tmp_path / "deps"
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "-d", str(deps), str(wheel)],
        check=True,
    )
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(venv / "bin/pip"), "install", "-q", "--no-index", "--find-links", str(deps),
         str(wheel)],
        env={**no_node, "https_proxy": UNREACHABLE, "http_proxy": UNREACHABLE},
        check=True,
    )  # fmt: skip
    served = subprocess.run(
        [str(venv / "bin/python"), "-c", SERVE_THE_PAGE],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    status, length, where = served.stdout.split()
    assert (status, int(length)) == ("200", (VENDOR / "xterm/xterm.mjs").stat().st_size)
    assert where.startswith(str(venv))


# Run in the fresh venv: the page's routes, and one vendored file fetched through them.
SERVE_THE_PAGE = """
import asyncio
from aiohttp import web, ClientSession
from subres.web import page

async def main():
    app = web.Application()
    page.add_routes(app, page.PageSettings(api_prefix="/apis/x/v1"))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    async with ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{port}/ui/vendor/xterm/xterm.mjs") as answer:
            body = await answer.read()
            print(answer.status, len(body), page.STATIC)
    await runner.cleanup()

asyncio.run(main())
"""
