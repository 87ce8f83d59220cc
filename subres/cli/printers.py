"""How the listing verbs print what they list, as `kubectl get -o` does.

Owns the output formats of `sessions` and `recordings`: a table (the
default: the columns of priority 0), `wide` (every column), `json` and
`yaml` (the list object itself) and `name` (`KIND.GROUP/NAME`, one a line);
and the refusal of any other format, in kubectl's words, before anything is
asked of the server.
"""

from __future__ import annotations

import json
from typing import Any

from subres.cli.api import CommandError
from subres.cli.commands import OUTPUT_FORMATS

__all__ = ["WHOLE", "check", "format_table", "print_whole"]

KNOWN = frozenset(OUTPUT_FORMATS)
"""The formats, to test against (`OUTPUT_FORMATS` lets argparse take any value)."""
WHOLE = ("json", "name", "yaml")
"""The formats printed from the list object itself rather than from a table."""


def check(output: str | None) -> None:
    """Refuse a format no listing prints, as kubectl refuses one (exit 1)."""
    if output is not None and output not in KNOWN:
        raise CommandError(
            f'unable to match a printer suitable for the output format "{output}", '
            f"allowed formats are: {','.join(OUTPUT_FORMATS)}"
        )


def print_whole(document: dict[str, Any], output: str, *, kind: str) -> None:
    """A list object as `-o json`, `-o yaml` or `-o name` print it; `kind` is `kind.group`."""
    if output == "json":
        print(json.dumps(document, indent=2))
    elif output == "yaml":
        import yaml  # only for this format: the verb's start stays light

        print(yaml.safe_dump(document, sort_keys=False), end="")
    else:
        for item in document.get("items") or []:
            print(f"{kind}/{_name(item)}")


def _name(item: Any) -> str:
    """An item's name: in its metadata, as Kubernetes objects have it, or at its top level."""
    if not isinstance(item, dict):
        return ""
    meta = item.get("metadata")
    return str(meta.get("name", "") if isinstance(meta, dict) else item.get("name", ""))


def format_table(table: dict[str, Any], *, namespaces: bool, wide: bool = False) -> str:
    """A Table's columns and rows as `kubectl get` prints them (`wide`: every column, as
    `-o wide`); "" when it has no rows."""
    shown = [
        i
        for i, c in enumerate(table.get("columnDefinitions") or [])
        if wide or c.get("priority", 0) == 0
    ]
    rows = table.get("rows") or []
    if not rows:
        return ""
    columns = table["columnDefinitions"]
    header = [str(columns[i].get("name", "")).upper() for i in shown]
    lines = [[_cell(row.get("cells", []), i) for i in shown] for row in rows]
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


def _cell(cells: list[Any], index: int) -> str:
    """One cell as kubectl prints it: booleans in lower case, a missing one as `<none>`."""
    value = cells[index] if index < len(cells) else None
    if value is None:
        return "<none>"
    return json.dumps(value) if isinstance(value, bool) else str(value)
