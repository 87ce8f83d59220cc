"""The `subres` command (also `kubectl subres`): one subcommand per verb.

Server-side verbs (`serve`, `demo`) and client verbs (`console`, …) share the
entry point; client verbs live in `subres.cli` and never import the server.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence

from subres.cli import commands as client_commands

__all__ = ["main"]


def _serve(ns: argparse.Namespace) -> int:
    from subres.server.options import Options
    from subres.server.run import serve

    options = Options.from_args(ns)
    problems = options.validate()
    if problems:
        for problem in problems:
            print(f"subres serve: {problem}", file=sys.stderr)
        return 2
    asyncio.run(serve(options))
    return 0


def _certs(ns: argparse.Namespace) -> int:
    from subres.server import certsverb

    return certsverb.run(ns)


def _demo(ns: argparse.Namespace) -> int:
    from subres.demo import run

    return run.main(ns)


def parser() -> argparse.ArgumentParser:
    """The full command line."""
    top = argparse.ArgumentParser(
        prog="subres", description="Interactive subresources for Kubernetes CRD objects."
    )
    top.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    client_commands.add_client_flags(top)
    verbs = top.add_subparsers(dest="verb", required=True, metavar="VERB")

    from subres.server.options import add_arguments

    serve = verbs.add_parser("serve", help="run the aggregated API server")
    add_arguments(serve)
    serve.set_defaults(func=_serve)

    from subres.server import certsverb

    certs = verbs.add_parser("certs", help="write a serving certificate Secret and caBundle")
    certsverb.add_arguments(certs)
    certs.set_defaults(func=_certs)

    from subres.demo.run import add_arguments as add_demo_arguments

    demo = verbs.add_parser("demo", help="run a standalone server with a demo machine")
    add_demo_arguments(demo)
    demo.set_defaults(func=_demo)

    client_commands.add_verbs(verbs)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; the process exit code."""
    ns = parser().parse_args(argv)
    level = {0: logging.WARNING, 1: logging.INFO}.get(ns.verbose, logging.DEBUG)
    if ns.verb in ("serve", "demo"):
        level = min(level, logging.INFO)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(ns.func(ns))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
