"""`subres recordings TARGET [NAME]`: a machine's recorded console sessions, listed or saved.

Lists them (`…/machines/NAME/recordings`) newest first, in the formats of
kubectl's `-o` (`subres.cli.printers`: a table, `wide`, `json`, `yaml`,
`name`), or saves one (`…/recordings/NAME`) to `--file FILE` (its own name
by default, `-` for stdout), streamed: `subres replay` plays the file. NAME
may be written as `-o name` prints it. Reading them needs `get` on
`machines/recordings`, whoever can reach the files.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
from pathlib import Path
from typing import Any, BinaryIO

from subres.cli import api, invocation, kubeconfig, printers
from subres.cli.api import CommandError
from subres.cli.kubeconfig import ClientConfig

__all__ = ["main"]

MAX_LIST = 16 << 20
NONE_WHY = (
    "Its console sessions are recorded when the server has a recordings directory "
    '(consoles.recordings) and the machine opts in (subres.dev/record-console: "true").'
)
COLUMNS = ("Name", "Size", "Started", "Title")
WIDE = ("Subresource", "Modified")
"""The columns `-o wide` adds."""
KIND = "recording"


# Every verb's `main` has this shape (the kubeconfig, then the verb's coroutine).
@api.command
def main(ns: argparse.Namespace) -> int:
    """List the recordings, or save one; 0."""
    if ns.name is not None and ns.output is not None:
        raise CommandError(
            "-o is how the list of recordings is printed; to save a recording "
            "elsewhere than in a file of its own name, pass --file FILE (- for stdout)"
        )
    printers.check(ns.output)
    config = kubeconfig.from_args(ns)
    return asyncio.run(_recordings(config, ns))


async def _recordings(config: ClientConfig, ns: argparse.Namespace) -> int:
    typed = api.parse_target(ns.target)
    target = await api.resolve(
        typed, config, group_version=ns.api_group_version, namespace_flag=ns.namespace
    )
    url = api.object_url(config, target, group_version=ns.api_group_version, websocket=False)
    url += "/recordings"
    if ns.name is None:
        body = await api.get(config, url, max_body=MAX_LIST, target=target)
        return _listed(api.json_object(body), ns, target=target)
    name = ns.name.rpartition("/")[2]  # as `-o name` prints it: KIND.GROUP/NAME
    output = ns.file or name
    saved = _Saved(output)
    try:
        await api.get(config, f"{url}/{name}", max_body=MAX_LIST, target=target, sink=saved.write)
    finally:
        saved.close()
    if output != "-":
        play = f"{invocation.command()} replay {shlex.quote(output)}"
        print(f"Saved {name} to {output}; play it with: {play}", file=sys.stderr)
    return 0


def _listed(document: dict[str, Any], ns: argparse.Namespace, *, target: api.Target) -> int:
    """Print the list as `-o` says; with a table, how to play the newest."""
    if ns.output in printers.WHOLE:
        group = ns.api_group_version.split("/")[0]
        printers.print_whole(document, ns.output, kind=f"{KIND}.{group}")
        return 0
    items = [i for i in document.get("items") or [] if isinstance(i, dict)]
    fields = ["name", "size", "started", "title", "subresource", "modified"]
    definitions = [{"name": c, "priority": 0} for c in COLUMNS]
    table = {
        "columnDefinitions": definitions + [{"name": c, "priority": 1} for c in WIDE],
        "rows": [{"cells": [i.get(f) for f in fields]} for i in items],
    }
    text = printers.format_table(table, namespaces=False, wide=ns.output == "wide")
    if not text:
        print(f"No recordings of {target}. {NONE_WHY}", file=sys.stderr)
        return 0
    print(text)
    subres = invocation.command()
    newest = shlex.quote(str(items[0].get("name")))
    namespace = f" -n {shlex.quote(ns.namespace)}" if ns.namespace else ""
    again = f"{subres} recordings {shlex.quote(ns.target)}{namespace} {newest}"
    print(f"Play the newest: {again} --file - | {subres} replay -", file=sys.stderr)
    return 0


class _Saved:
    """The file a recording is saved to, made once its first bytes arrive (not for a refusal)."""

    def __init__(self, output: str) -> None:
        self._output = output
        self._file: BinaryIO | None = None

    async def write(self, chunk: bytes) -> None:
        if self._file is None:
            self._file = self._open()
        self._file.write(chunk)

    def _open(self) -> BinaryIO:
        if self._output == "-":
            return os.fdopen(os.dup(sys.stdout.fileno()), "wb")
        try:
            return Path(self._output).open("wb")
        except OSError as exc:
            raise CommandError(f"cannot write {self._output}: {api.os_reason(exc)}") from None

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
