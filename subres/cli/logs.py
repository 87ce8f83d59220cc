"""`subres logs TARGET [-f] [--tail N] …`: a kept console's output, as `kubectl logs` prints.

Reads `…/machines/NAME/log` with the options `kubectl logs` sends for a pod
(`follow`, `tailLines`, `sinceSeconds`, `sinceTime`, `limitBytes`,
`timestamps`, `previous`) and writes the bytes to stdout as they arrive,
control characters and all. `-f` follows over plain chunked HTTP until
the console is let go or the command is interrupted. Reading needs `get` on
`machines/log`.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
from urllib.parse import urlencode

from subres.cli import api, kubeconfig
from subres.cli.api import CommandError
from subres.cli.kubeconfig import ClientConfig

__all__ = ["main"]

MAX_BODY = 16 << 20
"""A log without `-f` is at most the scrollback; more is not a log."""


@api.command
def main(ns: argparse.Namespace) -> int:
    """Print the log; 0 (also when interrupted while following)."""
    config = kubeconfig.from_args(ns)
    try:
        return asyncio.run(_logs(config, ns))
    except KeyboardInterrupt:
        return 0


def query(ns: argparse.Namespace) -> dict[str, str]:
    """The `log` options the flags ask for, as kubectl spells a pod's."""
    if ns.since is not None and ns.since_time is not None:
        raise CommandError("at most one of --since and --since-time may be given")
    options: dict[str, str] = {}
    if ns.follow:
        options["follow"] = "true"
    if ns.tail is not None and ns.tail >= 0:
        options["tailLines"] = str(ns.tail)
    if ns.since is not None:
        options["sinceSeconds"] = str(max(1, math.ceil(ns.since)))
    if ns.since_time is not None:
        options["sinceTime"] = ns.since_time
    if ns.limit_bytes is not None:
        options["limitBytes"] = str(ns.limit_bytes)
    if ns.timestamps:
        options["timestamps"] = "true"
    if ns.previous:
        options["previous"] = "true"
    if ns.console:
        options["console"] = ns.console
    return options


async def _logs(config: ClientConfig, ns: argparse.Namespace) -> int:
    options = query(ns)
    typed = api.parse_target(ns.target)
    target = await api.resolve(
        typed, config, group_version=ns.api_group_version, namespace_flag=ns.namespace
    )
    url = api.object_url(config, target, group_version=ns.api_group_version, websocket=False)
    url += "/log" + (f"?{urlencode(options)}" if options else "")
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb", buffering=0)

    async def write(chunk: bytes) -> None:
        out.write(chunk)

    try:
        await api.get(
            config,
            url,
            max_body=MAX_BODY,
            target=target,
            sink=write,
            request_timeout=None if ns.follow else api.OPEN_TIMEOUT,
        )
    finally:
        out.close()
    return 0
