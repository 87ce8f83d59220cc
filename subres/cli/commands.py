"""The client verbs' registration on the `subres` command line.

Owns the client connection flags (`--kubeconfig`, `--context`, `-n`), which
work before the verb (on the top-level parser) and after it (on each verb,
where they only count when given, so neither place overrides the other).
"""

from __future__ import annotations

import argparse
from typing import Any

from subres.cli import console, portforward, screenshot, vnc, web

__all__ = ["add_client_flags", "add_verbs"]


def add_client_flags(parser: argparse.ArgumentParser, *, on_verb: bool = False) -> None:
    """Add the kubeconfig selection flags; on a verb they default to nothing at all."""
    default = argparse.SUPPRESS if on_verb else None
    parser.add_argument(
        "--kubeconfig", metavar="FILE", default=default, help="kubeconfig file to use"
    )
    parser.add_argument(
        "--context", metavar="NAME", default=default, help="kubeconfig context to use"
    )
    parser.add_argument(
        "-n", "--namespace", metavar="NS", default=default, help="namespace of the object"
    )


VERBS: tuple[tuple[str, Any, str, str], ...] = (
    (
        "console",
        console,
        "connect to a machine's serial console (Ctrl+] leaves)",
        "Connect to the serial console of a machine. Ctrl+] leaves.",
    ),
    (
        "port-forward",
        portforward,
        "forward local ports (or stdin/stdout) to a machine's ports",
        "Forward local ports, or stdin/stdout with --stdio, to ports of a machine.",
    ),
    (
        "vnc",
        vnc,
        "open a machine's display in a local VNC viewer",
        "Relay a local port to a machine's VNC display and start a viewer, "
        'or with --proxy-only print {"port": N} and relay until interrupted.',
    ),
    (
        "screenshot",
        screenshot,
        "save a machine's display as a PNG file",
        "Save the current picture of a machine's display as a PNG file.",
    ),
    (
        "web",
        web,
        "open a machine's console and display in the browser (a page on localhost)",
        "Serve the console and VNC page on a local port; its connections use "
        "your kubeconfig's credentials, which the browser never sees.",
    ),
)
"""Each client verb: its name, its module (`add_arguments`, `main`), help and description."""


def add_verbs(verbs: Any) -> None:
    """Add every client verb to the subcommand set `verbs`."""
    for name, module, summary, description in VERBS:
        parser = verbs.add_parser(name, help=summary, description=description)
        module.add_arguments(parser)
        add_client_flags(parser, on_verb=True)
        parser.set_defaults(func=module.main)
