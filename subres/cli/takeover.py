"""Asking before `subres console` takes a console from whoever writes on it, as the page asks.

Before an interactive session (stdin a terminal, no `--force`, not
`--observe`) the machine's live sessions are read (`…/sessions`, RBAC `get
machines/sessions`); when someone writes, the user is asked
`In use by alice since 10:02 — take over? [y/N/o(bserve)]`: yes takes over as
before, `o` watches read-only instead, anything else (Enter, Ctrl+D) leaves
the writer alone. When the sessions cannot be read (no permission, an older
server) nobody is asked, and the session takes over as it always did.
Scripts (stdin not a terminal) are never asked.
"""

from __future__ import annotations

import asyncio
import sys
from datetime import datetime
from typing import Any

from subres.cli import api
from subres.cli.api import CommandError, Target
from subres.cli.kubeconfig import ClientConfig

__all__ = ["OBSERVER", "WRITER", "ask", "question"]

WRITER = "writer"
OBSERVER = "observer"
MAX_LIST = 4 << 20


async def ask(
    config: ClientConfig, target: Target, *, group_version: str, console: str = ""
) -> str:
    """`WRITER` or `OBSERVER`, as the user chose; `CommandError` if they left it alone.

    `console`: which of the machine's consoles (its name; "" for the default one).
    """
    holder = await _writer(config, target, group_version=group_version, console=console)
    if holder is None:
        return WRITER
    answer = await asyncio.to_thread(_prompt, question(holder))
    if answer in ("y", "yes"):
        return WRITER
    if answer in ("o", "observe"):
        return OBSERVER
    raise CommandError(f"left the console of {target} to {holder.get('user', 'its writer')}")


def question(holder: dict[str, Any]) -> str:
    """`In use by alice since 10:02 — take over? [y/N/o(bserve)] `, in local time."""
    user = str(holder.get("user") or "someone")
    try:
        since = datetime.fromisoformat(str(holder.get("since"))).astimezone().strftime("%H:%M")
    except ValueError:
        return f"In use by {user} — take over? [y/N/o(bserve)] "
    return f"In use by {user} since {since} — take over? [y/N/o(bserve)] "


async def _writer(
    config: ClientConfig, target: Target, *, group_version: str, console: str
) -> dict[str, Any] | None:
    """The console's live writer, if the sessions can be read and there is one."""
    url = api.object_url(config, target, group_version=group_version, websocket=False)
    try:
        body = await api.get(config, f"{url}/sessions", max_body=MAX_LIST, target=target)
    except CommandError:
        return None
    listing = api.json_object(body)
    items, consoles = listing.get("items"), listing.get("consoles")
    # Sessions name their console only when the machine has several (its first: the default).
    several = isinstance(consoles, list) and len(consoles) > 1
    unit = (console or str(consoles[0])) if several and isinstance(consoles, list) else ""
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict) and (
            item.get("subresource"),
            item.get("mode"),
            item.get("unit") or "",
        ) == ("console", WRITER, unit):
            return item
    return None


def _prompt(text: str) -> str:
    print(text, end="", file=sys.stderr, flush=True)
    line = sys.stdin.readline()
    if not line:
        print(file=sys.stderr)  # Ctrl+D: the answer ends its line too
    return line.strip().lower()
