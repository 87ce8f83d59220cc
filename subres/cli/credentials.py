"""The credentials every request carries, kept fresh as client-go keeps them.

Owns the request headers of one kubeconfig user and, for an exec credential
plugin, when to run it again: once its credential's `expirationTimestamp`
has passed, and once after the server answered 401 to the credential in use
(client-go does both). A plugin's client certificate is loaded again into
the same `ssl.SSLContext`, so later handshakes present the new one. Long
`port-forward`, `vnc` and `web` sessions dial again and again; each dial asks
for `fresh()` headers.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Callable, Mapping

from subres.cli import execplugin

__all__ = ["Credentials", "headers_for"]

Reload = Callable[[bytes, bytes], None]
"""Loads a new client certificate and key (PEM) for later TLS handshakes."""


def headers_for(token: str | None, basic: tuple[str, str] | None) -> dict[str, str]:
    """The `Authorization` header for a bearer token, else for basic auth, else none."""
    if token:
        return {"Authorization": f"Bearer {token}"}
    if basic is not None:
        pair = f"{basic[0]}:{basic[1]}".encode()
        return {"Authorization": "Basic " + base64.b64encode(pair).decode()}
    return {}


class Credentials:
    """Fixed headers, or those of an exec plugin's credential, run again when it expires."""

    def __init__(
        self,
        headers: Mapping[str, str],
        *,
        plugin: Callable[[], execplugin.Credential] | None = None,
        current: execplugin.Credential | None = None,
        reload_certificate: Reload | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._headers = dict(headers)
        self._plugin = plugin
        self._current = current
        self._reload = reload_certificate
        self._clock = clock
        self._refreshing = asyncio.Lock()

    @property
    def headers(self) -> Mapping[str, str]:
        """The headers as they are now (no refresh)."""
        return dict(self._headers)

    def expired(self) -> bool:
        """True when the plugin's credential has an expiry and it has passed."""
        expires = self._current.expires if self._current is not None else None
        return expires is not None and self._clock() >= expires

    async def fresh(self) -> Mapping[str, str]:
        """The headers to send now, running the plugin again first if its credential expired."""
        if self._plugin is not None and self.expired():
            async with self._refreshing:
                if self.expired():  # another caller may have refreshed meanwhile
                    await self._refresh()
        return self.headers

    async def rejected(self, used: Mapping[str, str]) -> bool:
        """After a 401 to `used`: True when there are new credentials worth one more try."""
        if self._plugin is None:
            return False
        async with self._refreshing:
            if dict(used) != self._headers:
                return True  # another caller already fetched new ones
            before = _material(self._current)
            await self._refresh()
            return _material(self._current) != before

    async def _refresh(self) -> None:
        assert self._plugin is not None
        # The plugin may take a while (a login); the loop keeps serving other connections.
        credential = await asyncio.to_thread(self._plugin)
        if credential.client_certificate and credential.client_key and self._reload:
            self._reload(credential.client_certificate, credential.client_key)
        self._headers = headers_for(credential.token, None)
        self._current = credential


def _material(credential: execplugin.Credential | None) -> tuple[object, ...] | None:
    """What a credential presents (not when it expires)."""
    if credential is None:
        return None
    return (credential.token, credential.client_certificate, credential.client_key)
