"""What users see of other libraries' warnings: nothing, unless they ask.

Every verb's entry point is started as users start it (the installed `subres`
script) and must print only its own help. A second pass runs every verb in an
interpreter where subres's own warnings are errors, after importing every module
of the package: a deprecation in a dependency that subres's code trips over
fails here when the lock is refreshed (`scripts/lock`), not on a user's screen.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from subres import main

TIMEOUT = 60.0
VERBS = sorted(verb.name for verb in main._VERBS)

STRICT = """\
import importlib, pkgutil, sys, warnings
warnings.filterwarnings("ignore")  # other libraries' own: the test above covers them
warnings.filterwarnings("error", module=r"subres(\\.|$)")
import subres
for info in pkgutil.walk_packages(subres.__path__, "subres."):
    if info.name != "subres.__main__":  # it runs the command
        importlib.import_module(info.name)
from subres.main import main
try:
    main([{verb!r}, "--help"])
except SystemExit as exc:
    sys.exit(exc.code)
"""


def _quiet_env() -> dict[str, str]:
    """The environment without any warning settings of the caller's (pytest's -W included)."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONWARNINGS", "PYTHONDEVMODE")}


@pytest.mark.parametrize("verb", VERBS)
def test_a_verb_prints_no_warning_of_another_library(verb: str) -> None:
    script = shutil.which("subres", path=os.path.dirname(sys.executable))
    assert script is not None, "the subres script is installed beside this Python"
    done = subprocess.run(
        [script, verb, "--help"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=_quiet_env(),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert done.stdout.startswith("usage:")


@pytest.mark.parametrize("verb", VERBS)
def test_subres_trips_over_no_deprecation_of_its_dependencies(verb: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", STRICT.format(verb=verb)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=_quiet_env(),
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Warning" not in done.stderr


WARN = """\
import sys, warnings
from subres.main import _quiet_other_libraries, _top_level
_quiet_other_libraries(_top_level(sys.argv[1:]))
warnings.warn_explicit("from a library", UserWarning, "lib.py", 1, "lib")
warnings.warn_explicit("from subres", UserWarning, "x.py", 1, "subres.x")
"""


@pytest.mark.parametrize(
    ("verbose", "shown"), [(False, ["from subres"]), (True, ["from a library", "from subres"])]
)
def test_only_verbose_shows_other_libraries_warnings(verbose: bool, shown: list[str]) -> None:
    argv = ["-v"] * verbose + ["console", "demo"]
    done = subprocess.run(
        [sys.executable, "-c", WARN, *argv],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=_quiet_env(),
        check=True,
    )
    assert [w for w in ("from a library", "from subres") if w in done.stderr] == shown
