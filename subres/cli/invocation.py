"""How the user runs this very `subres`: the words every printed hint starts with.

A hint (`subres console demo`, `Play the newest: subres recordings …`) works
as printed only if the shell finds this install by that name. Installed into
a virtualenv that is not activated, `subres` is not on PATH (or is another
install), so a hint names this install's script by its absolute path.
"""

from __future__ import annotations

import shlex
import shutil
import sys
from pathlib import Path

__all__ = ["command"]

NAME = "subres"


def command() -> str:
    """`subres` when PATH finds this install under that name, else how to run it, shell-quoted."""
    # Not resolved: a virtualenv's python is a link out of it, its scripts sit beside the link.
    script = Path(sys.executable).parent / NAME
    found = shutil.which(NAME)
    if found is not None and script.exists() and Path(found).resolve() == script.resolve():
        return NAME
    if script.exists():
        return shlex.quote(str(script.absolute()))
    # A source tree run with `python -m subres`, never installed.
    return f"{shlex.quote(sys.executable)} -m {NAME}"
