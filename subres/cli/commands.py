"""The client verbs' registration on the `subres` command line."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_verbs"]


def add_verbs(verbs: Any) -> None:
    """Add every client verb to the subcommand set `verbs`."""
    del verbs
    _ = argparse
