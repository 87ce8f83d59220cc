"""The README and docs/ as a reader meets them: commands that run, links that lead somewhere.

Every fenced block marked `sh runnable` in README.md and docs/*.md runs,
with `sh -e`, against a running `subres demo`, as a reader who did what the
demo printed (`export KUBECONFIG=…`) would run it: `subres` and `kubectl` on
PATH, a scratch directory and home. A block must end with exit code 0; one
that cannot run against the demo is not marked. Relative links must name a
file that exists and, after `#`, one of its headings.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cli.conftest import CLI_TIMEOUT, Demo, cli_env, running_demo

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKER = "sh runnable"
README_LINES = 250
FENCE = re.compile(r"^```(.*)$")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


@dataclass(frozen=True)
class Block:
    """A fenced block marked runnable: where it is, and its text."""

    where: str
    text: str


def blocks(path: Path) -> Iterator[Block]:
    """The runnable blocks of one Markdown file."""
    inside: str | None = None
    start, lines = 0, list[str]()
    for number, line in enumerate(path.read_text().splitlines(), 1):
        fence = FENCE.match(line)
        if fence and inside is None:
            inside, start, lines = fence.group(1).strip(), number, []
        elif fence:
            if inside == MARKER:
                yield Block(f"{path.relative_to(ROOT)}:{start}", "\n".join(lines) + "\n")
            inside = None
        elif inside is not None:
            lines.append(line)


RUNNABLE = [block for path in DOCS for block in blocks(path)]


@pytest.fixture(scope="module")
def demo() -> Iterator[Demo]:
    with running_demo() as running:
        yield running


def test_the_docs_have_runnable_commands() -> None:
    """The README's tour is among them: a marker spelled wrong would test nothing."""
    assert any(block.where.startswith("README.md:") for block in RUNNABLE)


@pytest.mark.parametrize("block", RUNNABLE, ids=[b.where for b in RUNNABLE])
def test_a_runnable_block_runs_against_the_demo(
    block: Block, demo: Demo, tmp_path: Path, kubectl_bin: Path
) -> None:
    env = cli_env(tmp_path)
    path = [str(Path(sys.executable).parent), str(kubectl_bin.parent), env.get("PATH", "")]
    env |= {"KUBECONFIG": str(demo.kubeconfig), "PATH": os.pathsep.join(path)}
    done = subprocess.run(
        ["sh", "-e", "-c", block.text],
        cwd=tmp_path,
        capture_output=True,
        env=env,
        timeout=CLI_TIMEOUT * 2,
        check=False,
    )
    assert done.returncode == 0, (
        f"{block.where} exited {done.returncode}:\n{block.text}\nstdout:\n"
        f"{done.stdout.decode(errors='replace')}\nstderr:\n{done.stderr.decode(errors='replace')}"
    )


def test_the_readme_fits_on_a_page() -> None:
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= README_LINES, f"README.md has {lines} lines; details belong in docs/"


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation gone, spaces dashed."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {
        slug(line.lstrip("#"))
        for line in path.read_text().splitlines()
        if re.match(r"#{1,6} ", line)
    }


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_relative_links_lead_somewhere(doc: Path) -> None:
    broken = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # http:, https:, mailto: are not ours to check here
        file, _, anchor = target.partition("#")
        linked = (doc.parent / file).resolve() if file else doc
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading #{anchor}")
    assert broken == []
