"""`subres sessions [TARGET]`: who holds which console, printed as `kubectl get` prints it.

Reads the `Session` objects of one machine (`…/machines/NAME/sessions`), of
the namespace, or of every namespace (`-A`) as a `meta.k8s.io` Table, the
same request `kubectl get sessions.subresources.subres.dev` makes; `-o json`
and `-o yaml` print the `SessionList` itself, as kubectl's `-o` does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from subres.cli import api, kubeconfig
from subres.cli.kubeconfig import ClientConfig

__all__ = ["format_table", "main"]

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
MAX_BODY = 16 << 20


@api.command
def main(ns: argparse.Namespace) -> int:
    """Print the sessions; 0."""
    config = kubeconfig.from_args(ns)
    return asyncio.run(_sessions(config, ns))


async def _sessions(config: ClientConfig, ns: argparse.Namespace) -> int:
    group_version = ns.api_group_version
    base = f"{config.server.rstrip('/')}/apis/{group_version}"
    if ns.target:
        typed = api.parse_target(ns.target)
        target = await api.resolve(
            typed, config, group_version=group_version, namespace_flag=ns.namespace
        )
        url = api.object_url(config, target, group_version=group_version, websocket=False)
        url += "/sessions"
    elif ns.all_namespaces:
        url = f"{base}/sessions"
    else:
        url = f"{base}/namespaces/{config.namespace}/sessions"
    whole = ns.output in ("json", "yaml")
    body = await api.get(config, url, max_body=MAX_BODY, accept=None if whole else TABLE)
    document = api.json_object(body)
    if ns.output == "json":
        print(json.dumps(document, indent=2))
        return 0
    if ns.output == "yaml":
        import yaml  # only for this output: the verb's start stays light

        print(yaml.safe_dump(document, sort_keys=False), end="")
        return 0
    text = format_table(document, namespaces=bool(ns.all_namespaces and not ns.target))
    if text:
        print(text)
    else:
        where = "any namespace" if ns.all_namespaces else f"namespace {config.namespace!r}"
        print(f"No sessions found in {where}.", file=sys.stderr)
    return 0


def format_table(table: dict[str, Any], *, namespaces: bool) -> str:
    """A Table's columns and rows as `kubectl get` prints them; "" when it has no rows."""
    columns = [c for c in table.get("columnDefinitions") or [] if c.get("priority", 0) == 0]
    rows = table.get("rows") or []
    if not rows:
        return ""
    header = [str(c.get("name", "")).upper() for c in columns]
    lines = [[str(cell) for cell in row.get("cells", [])[: len(columns)]] for row in rows]
    if namespaces:
        header.insert(0, "NAMESPACE")
        for line, row in zip(lines, rows, strict=True):
            meta = (row.get("object") or {}).get("metadata") or {}
            line.insert(0, str(meta.get("namespace", "")))
    widths = [max(len(line[i]) for line in [header, *lines]) for i in range(len(header))]
    return "\n".join(
        "   ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in [header, *lines]
    )
