"""How the benchmarks reach subres: one console URL shape, one way to connect.

Shared by the benchmark driver and its client worker processes so that every
measured session is opened the same way (TLS with the bench CA, a bearer
token, no compression, no proxy, no client pings).
"""

from __future__ import annotations

import resource
import ssl
from dataclasses import dataclass
from pathlib import Path

import websockets
from websockets.asyncio.client import connect

__all__ = ["RAW", "V5", "Target", "raise_open_files_limit"]

RAW = "plain.kubevirt.io"
V5 = "v5.channel.k8s.io"
GROUP_PATH = "/apis/subresources.subres.dev/v1alpha1/namespaces/default/machines"


def raise_open_files_limit() -> None:
    """Thousands of sessions need thousands of descriptors: soft limit up to hard."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


@dataclass(frozen=True)
class Target:
    """A running subres: where it listens, what it trusts, who we are."""

    port: int
    ca: Path
    token: str
    scheme: str = "wss"
    """`ws` when the bench harness serves without TLS."""

    def url(self, machine: str, sub: str = "console") -> str:
        """The console (or `sub`) URL of `machine`."""
        return f"{self.scheme}://127.0.0.1:{self.port}{GROUP_PATH}/{machine}/{sub}"

    def ssl_context(self) -> ssl.SSLContext | None:
        """A client context trusting only the bench CA (None without TLS)."""
        if self.scheme == "ws":
            return None
        return ssl.create_default_context(cafile=str(self.ca))

    def connect(
        self,
        machine: str,
        subprotocol: str,
        tls: ssl.SSLContext | None,
        timeout: float,
        *,
        sub: str = "console",
    ) -> connect:
        """A `websockets` connect for `machine`; idle sessions only answer server pings."""
        return connect(
            self.url(machine, sub),
            ssl=tls,
            additional_headers={"Authorization": f"Bearer {self.token}"},
            subprotocols=[websockets.Subprotocol(subprotocol)],
            compression=None,
            # An https_proxy in the environment must not route loopback traffic.
            proxy=None,
            ping_interval=None,
            open_timeout=timeout,
            close_timeout=timeout,
            max_size=None,
        )
