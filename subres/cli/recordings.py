"""`subres recordings TARGET [NAME]`: a machine's recorded console sessions, listed or saved.

Lists them (`…/machines/NAME/recordings`) as a table, newest first, or saves
one (`…/recordings/NAME`) to `-o FILE` (its own name by default, `-` for
stdout), streamed: `subres replay` plays the file. Reading them needs `get`
on `machines/recordings`, whoever can reach the files.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
from pathlib import Path
from typing import BinaryIO

from subres.cli import api, kubeconfig
from subres.cli.api import CommandError
from subres.cli.kubeconfig import ClientConfig
from subres.cli.sessions import format_table

__all__ = ["main"]

MAX_LIST = 16 << 20
NONE_WHY = (
    "Its console sessions are recorded when the server has a recordings directory "
    '(consoles.recordings) and the machine opts in (subres.dev/record-console: "true").'
)


# Every verb's `main` has this shape (the kubeconfig, then the verb's coroutine).
@api.command
def main(ns: argparse.Namespace) -> int:
    """List the recordings, or save one; 0."""
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
        items = api.json_object(body).get("items") or []
        columns = ["Name", "Size", "Started", "Title"]
        rows = [
            {"cells": [i.get("name"), i.get("size"), i.get("started"), i.get("title")]}
            for i in items
            if isinstance(i, dict)
        ]
        table = {"columnDefinitions": [{"name": c} for c in columns], "rows": rows}
        text = format_table(table, namespaces=False)
        if not text:
            print(f"No recordings of {target}. {NONE_WHY}", file=sys.stderr)
            return 0
        print(text)
        newest = shlex.quote(str(rows[0]["cells"][0]))
        namespace = f" -n {shlex.quote(ns.namespace)}" if ns.namespace else ""
        again = f"subres recordings {shlex.quote(ns.target)}{namespace} {newest}"
        print(f"Play the newest: {again} -o - | subres replay -", file=sys.stderr)
        return 0
    output = ns.output or ns.name
    saved = _Saved(output)
    try:
        await api.get(
            config, f"{url}/{ns.name}", max_body=MAX_LIST, target=target, sink=saved.write
        )
    finally:
        saved.close()
    if output != "-":
        print(f"Saved {ns.name} to {output}; play it with: subres replay {output}", file=sys.stderr)
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
