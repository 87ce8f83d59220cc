"""A minimal third-party console client: any WebSocket library and a bearer token.

Usage: python examples/clients/console_ws.py URL TOKEN CA_FILE
Sends a line on stdin (channel 0) and prints what comes back on stdout (channel 1),
speaking `v5.channel.k8s.io` as `kubectl exec` does.
"""

from __future__ import annotations

import asyncio
import ssl
import sys

from websockets.asyncio.client import connect


async def main(url: str, token: str, ca: str) -> None:
    """Type one command, print the output until the server closes."""
    async with connect(
        url,
        ssl=ssl.create_default_context(cafile=ca),
        additional_headers={"Authorization": f"Bearer {token}"},
        subprotocols=["v5.channel.k8s.io"],  # type: ignore[list-item]
        compression=None,
    ) as ws:
        await ws.send(b"\x00echo hello from $(hostname)\nexit\n")
        async for message in ws:
            if isinstance(message, bytes) and message[:1] == b"\x01":
                sys.stdout.buffer.write(message[1:])
                sys.stdout.flush()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
