"""`subres screenshot`: a machine's display saved as a PNG file.

Owns the verb's flags and one GET of the `screenshot` subresource with the
kubeconfig's credentials; the body is checked to be a PNG and written to
`-o FILE` (`-` for stdout). A refusal prints the server's Status message.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from subres.cli import api, kubeconfig
from subres.cli.api import CommandError
from subres.cli.kubeconfig import ClientConfig

__all__ = ["PNG_SIGNATURE", "main"]

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
REQUEST_TIMEOUT = 60.0
"""The server bounds its own wait for the VNC server; this bounds the rest."""
MAX_BODY = 256 << 20


@api.command
def main(ns: argparse.Namespace) -> int:
    """Fetch and save one screenshot."""
    typed = api.parse_target(ns.target)
    if ns.output == "-" and sys.stdout.isatty():
        # As curl does: a PNG would scramble the terminal.
        raise CommandError("-o - would write a PNG image to your terminal; redirect it or -o FILE")
    config = kubeconfig.from_args(ns)
    png = asyncio.run(_fetch(config, typed, ns))
    try:
        if ns.output == "-":
            sys.stdout.buffer.write(png)
            sys.stdout.buffer.flush()
        else:
            Path(ns.output).write_bytes(png)
    except OSError as exc:
        raise CommandError(f"cannot write {ns.output}: {exc.strerror or exc}") from None
    return 0


async def _fetch(config: ClientConfig, typed: api.TargetText, ns: argparse.Namespace) -> bytes:
    group_version = ns.api_group_version
    target = await api.resolve(
        typed, config, group_version=group_version, namespace_flag=ns.namespace
    )
    base = api.object_url(config, target, group_version=group_version, websocket=False)
    body = await api.get(
        config,
        f"{base}/screenshot",
        target=target,
        max_body=MAX_BODY,
        request_timeout=REQUEST_TIMEOUT,
    )
    if not body.startswith(PNG_SIGNATURE):
        raise CommandError(f"the server's answer is not a PNG image ({len(body)} bytes)")
    return body
