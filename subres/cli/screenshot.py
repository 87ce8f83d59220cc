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

import aiohttp

from subres.cli import kubeconfig, portforward
from subres.cli.kubeconfig import ClientConfig
from subres.cli.portforward import ForwardError

__all__ = ["PNG_SIGNATURE", "add_arguments", "main"]

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
REQUEST_TIMEOUT = 60.0
"""The server bounds its own wait for the VNC server; this bounds the rest."""
MAX_BODY = 256 << 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `screenshot` flags (the client connection flags are added by the caller)."""
    parser.add_argument("target", metavar="[machine/]NAME", help="the machine to capture")
    parser.add_argument(
        "-o", "--output", required=True, metavar="FILE", help="PNG file to write (- for stdout)"
    )
    parser.add_argument(
        "--api-group-version", default=portforward.DEFAULT_GROUP_VERSION, help=argparse.SUPPRESS
    )


def main(ns: argparse.Namespace) -> int:
    """Fetch and save one screenshot."""
    try:
        target = portforward.parse_target(ns.target)
        config = kubeconfig.from_args(ns)
        base = portforward.object_url(
            config, group_version=ns.api_group_version, target=target, websocket=False
        )
        png = asyncio.run(_fetch(config, f"{base}/screenshot"))
        if ns.output == "-":
            sys.stdout.buffer.write(png)
            sys.stdout.buffer.flush()
        else:
            Path(ns.output).write_bytes(png)
    except (kubeconfig.KubeconfigError, ForwardError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: cannot write {ns.output}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0


async def _fetch(config: ClientConfig, url: str) -> bytes:
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as http,
            http.get(
                url,
                headers=dict(config.headers),
                ssl=config.ssl if config.ssl is not None else True,
                server_hostname=config.server_hostname,
            ) as response,
        ):
            body = await _body(response)
            if response.status != 200:
                raise ForwardError(portforward.status_message(body, response.status))
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise ForwardError(f"cannot get {url}: {exc or type(exc).__name__}") from None
    if not body.startswith(PNG_SIGNATURE):
        raise ForwardError(f"the server's answer is not a PNG image ({len(body)} bytes)")
    return body


async def _body(response: aiohttp.ClientResponse) -> bytes:
    body = bytearray()
    async for chunk in response.content.iter_chunked(1 << 16):
        body += chunk
        if len(body) > MAX_BODY:
            raise ForwardError(f"the server's answer is over {MAX_BODY} bytes")
    return bytes(body)
