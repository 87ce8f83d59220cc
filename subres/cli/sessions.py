"""`subres sessions [TARGET]`: who holds which console, printed as `kubectl get` prints it.

Reads the `Session` objects of one machine (`…/machines/NAME/sessions`), of
the namespace, or of every namespace (`-A`) as a `meta.k8s.io` Table, the
same request `kubectl get sessions.subresources.subres.dev` makes, in the
formats of kubectl's `-o` (`subres.cli.printers`).
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from subres.cli import api, kubeconfig, printers
from subres.cli.kubeconfig import ClientConfig

__all__ = ["main"]

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
MAX_BODY = 16 << 20


@api.command
def main(ns: argparse.Namespace) -> int:
    """Print the sessions; 0."""
    printers.check(ns.output)
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
    whole = ns.output in printers.WHOLE
    body = await api.get(config, url, max_body=MAX_BODY, accept=None if whole else TABLE)
    document = api.json_object(body)
    if whole:
        printers.print_whole(document, ns.output, kind=f"session.{group_version.split('/')[0]}")
        return 0
    text = printers.format_table(
        document,
        namespaces=bool(ns.all_namespaces and not ns.target),
        wide=ns.output == "wide",
    )
    if text:
        print(text)
    else:
        where = "any namespace" if ns.all_namespaces else f"namespace {config.namespace!r}"
        print(f"No sessions found in {where}.", file=sys.stderr)
    return 0
