"""The `subres` command (also `kubectl subres`): one subcommand per verb.

Server-side verbs (`serve`, `agent`, `certs`, `demo`) and client verbs (`console`, …)
share the entry point; client verbs live in `subres.cli` and never import the
server. The command line is parsed twice: first to learn the verb, with no
verb's flags loaded, then with only that verb's flags, so a client verb never
pays for importing the server, and a verb's module is imported only to run it.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import NamedTuple, cast

from subres.cli import commands as client_commands

__all__ = ["main", "parser"]

Flags = Callable[[argparse.ArgumentParser], None]
Run = Callable[[argparse.Namespace], int]


class _Verb(NamedTuple):
    name: str
    summary: str
    description: str | None
    flags: str | Flags
    """Adds the verb's flags: a function, or `module:function` imported when needed."""
    run: str | Run
    """Runs the verb: a function, or `module:function` imported when needed."""


def _load(where: str | Callable[..., object]) -> Callable[..., object]:
    if callable(where):
        return where
    module, _, name = where.partition(":")
    loaded: Callable[..., object] = getattr(importlib.import_module(module), name)
    return loaded


def _serve(ns: argparse.Namespace) -> int:
    from subres.kube.client import ApiError
    from subres.server.options import Options
    from subres.server.run import serve
    from subres.serving import loops

    options = Options.from_args(ns)
    problems = options.validate()
    if problems:
        for problem in problems:
            print(f"subres serve: {problem}", file=sys.stderr)
        return 2
    try:
        loops.run(serve(options), loop=options.loop)
    except (ApiError, OSError, ValueError) as exc:
        # Start-up failures (an unreadable kubeconfig or config, a busy port) are the
        # operator's to fix: say what, not where in our code.
        print(f"subres serve: {exc}", file=sys.stderr)
        return 1
    return 0


def _completion(ns: argparse.Namespace) -> int:
    from subres.cli import completion

    # Every verb's flags loaded: the script completes all of them.
    print(completion.script(parser(), ns.shell), end="")
    return 0


_VERBS = (
    _Verb(
        "serve",
        "run the aggregated API server",
        None,
        "subres.server.options:add_arguments",
        _serve,
    ),
    _Verb(
        "agent",
        "run the node agent that relays to node-local sockets",
        None,
        "subres.agent.options:add_arguments",
        "subres.agent.run:main",
    ),
    _Verb(
        "certs",
        "write a serving certificate Secret and caBundle",
        None,
        "subres.server.certsverb:add_arguments",
        "subres.server.certsverb:run",
    ),
    _Verb(
        "demo",
        "run a standalone server with a demo machine",
        None,
        "subres.demo.run:add_arguments",
        "subres.demo.run:main",
    ),
    *(
        _Verb(v.name, v.summary, v.description, v.flags, f"{v.module}:main")
        for v in client_commands.VERBS
    ),
    _Verb(
        "completion",
        "print a shell completion script (bash, zsh or fish)",
        "Print the completion script of a shell for subres, made from its own command "
        "line: for bash, source <(subres completion bash).",
        "subres.cli.completion:add_arguments",
        _completion,
    ),
)
_CLIENT = frozenset(v.name for v in client_commands.VERBS)
_CLUSTER = frozenset(v.name for v in client_commands.VERBS if v.cluster)


def parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line; with `only`, just that verb's flags are loaded ("" loads none)."""
    # kubectl runs us as kubectl-subres: usage lines then read as the user typed them.
    plugin = sys.argv[0].rsplit("/", 1)[-1] == "kubectl-subres"
    top = argparse.ArgumentParser(
        prog="kubectl subres" if plugin else "subres",
        description="Interactive subresources for Kubernetes CRD objects.",
    )
    top.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    top.add_argument("--version", action=_Version)
    client_commands.add_client_flags(top)
    verbs = top.add_subparsers(dest="verb", required=True, metavar="VERB")
    for verb in _VERBS:
        loaded = only is None or only == verb.name
        sub = verbs.add_parser(
            verb.name, help=verb.summary, description=verb.description, add_help=loaded
        )
        if loaded:
            _load(verb.flags)(sub)
            if verb.name in _CLUSTER:
                client_commands.add_client_flags(sub, on_verb=True)
    return top


class _Version(argparse.Action):
    """`--version`: the installed package's version, looked up only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str, **_: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            installed = version("subres")
        except PackageNotFoundError:  # run from a source tree that was never installed
            installed = "unknown (not installed)"
        print(f"subres {installed}")
        parser.exit()


def _top_level(argv: list[str]) -> argparse.Namespace:
    """The verb `argv` names and the flags before it, found without loading any verb's flags."""
    ns, _ = parser(only="").parse_known_args(argv)
    return ns


def _server_verb_problem(top: argparse.Namespace, ns: argparse.Namespace) -> str | None:
    """Client flags given before a server verb: honoured where they mean something, else refused.

    Without this, `subres --kubeconfig K serve` would silently run in-cluster:
    serve's own `--kubeconfig` default replaces the top-level value.
    """
    for flag in ("context", "namespace"):
        if getattr(top, flag):
            return f"--{flag} is a flag of the client verbs; {ns.verb} does not take it"
    if top.kubeconfig is None:
        return None
    from pathlib import Path

    if ns.verb != "serve":
        return f"--kubeconfig is a flag of the client verbs and serve; {ns.verb} does not take it"
    given = Path(top.kubeconfig)
    if ns.kubeconfig is not None and ns.kubeconfig != given:
        return f"--kubeconfig is given twice: {given} before serve and {ns.kubeconfig} after it"
    ns.kubeconfig = given
    return None


def _configure_logging(ns: argparse.Namespace) -> None:
    import logging

    level = {0: logging.WARNING, 1: logging.INFO}.get(ns.verbose, logging.DEBUG)
    if ns.verb in ("serve", "demo", "agent"):
        from subres.serving import logs

        logs.configure(
            level=min(level, logging.INFO),
            logging_format=ns.logging_format,
            third_party=ns.verbose > 0,
        )
        return
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not ns.verbose:
        from subres.serving.logs import own_or_error

        for handler in logging.getLogger().handlers:
            handler.addFilter(own_or_error)


def _quiet_other_libraries(top: argparse.Namespace) -> None:
    """Hide other libraries' warnings (a dependency's deprecation is theirs to fix, not
    the user's to read) unless `-v` or Python's own `-W`/`PYTHONWARNINGS` asks for them.

    Installed before any verb's module is imported: libraries warn as they are imported
    (asyncssh about DSA with cryptography 51). subres's own warnings pass to the filters
    already in force, so a test that turns them into errors still sees them.
    """
    if top.verbose or sys.warnoptions:
        return
    warnings.filterwarnings("ignore", module=r"(?!subres(\.|$))")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; the process exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    top = _top_level(args)
    _quiet_other_libraries(top)
    verb = str(top.verb)
    ns = parser(only=verb).parse_args(args)
    if argv is None and verb == "serve":
        from subres.serving.reclaim import use_system_malloc

        use_system_malloc()
    if verb not in _CLIENT and (problem := _server_verb_problem(top, ns)):
        print(f"subres {verb}: {problem}", file=sys.stderr)
        return 2
    _configure_logging(ns)
    run = next(v.run for v in _VERBS if v.name == verb)
    try:
        return cast(Run, _load(run))(ns)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
