"""The serving TLS context, reloaded from its files without restarting the listener.

Owns the `ssl.SSLContext` aiohttp's listener uses: TLS 1.2 or later, HTTP/1.1
only, a client certificate asked for but not required, and the serving
certificate and client CAs re-read whenever their files change. Also reads the
client's certificate off a connection. Deciding what identity that certificate
carries, and which CA it must chain to, belongs to `subres.auth`.

How reloading works: the listener keeps one outer context for its lifetime;
its `sni_callback`, which OpenSSL calls for every handshake whether or not the
client sent a server name, switches the connection to the newest complete
context. Live connections keep the context they started with.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import threading
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from subres.kube.status import StatusError

__all__ = ["ReloadingTLS", "peer_certificate", "replica_caller"]

logger = logging.getLogger(__name__)

# (mtime_ns, size, inode) of a file, or None when it cannot be stat'ed.
_Stamp = tuple[int, int, int] | None


class ReloadingTLS:
    """A server context whose certificate and client CAs follow their files."""

    def __init__(
        self,
        *,
        cert: Path,
        key: Path,
        client_ca: Sequence[Path] = (),
        empty_client_ca_ok: bool = False,
        require_client_cert: bool = False,
    ) -> None:
        """Load the files now if they are usable; `ready` says whether they were.

        `client_ca` lists every CA a client certificate may chain to (the
        client CA, the front-proxy CA); empty means no certificate is asked for.
        With `empty_client_ca_ok` an empty CA file trusts nothing instead of
        failing the load (cluster mode: the cluster need not publish every CA).
        With `require_client_cert` a handshake without one fails (the node agent).
        """
        self._cert = cert
        self._key = key
        self._client_ca = tuple(client_ca)
        self._empty_client_ca_ok = empty_client_ca_ok
        self._require = require_client_cert
        # watch() reloads in a worker thread while tests or callers may reload directly.
        self._lock = threading.Lock()
        self._current: ssl.SSLContext | None = None
        self._loaded: tuple[_Stamp, ...] | None = None
        self._failed: tuple[_Stamp, ...] | None = None
        self._context = self._base()
        self._context.sni_callback = self._select_context
        self.reload_if_changed()

    @property
    def context(self) -> ssl.SSLContext:
        """The context to give the listener; it never changes, what it serves does."""
        return self._context

    @property
    def ready(self) -> bool:
        """Whether a serving certificate is loaded (a /readyz check)."""
        return self._current is not None

    def reload_if_changed(self) -> bool:
        """Re-read the files if any changed; True when a new context was installed.

        An unreadable, half-written or mismatched set keeps the previous
        context; it is retried on every call and logged once per version.
        """
        with self._lock:
            # Stamped before reading: a change made while reading is seen on the next call.
            stamps = tuple(_stamp(path) for path in (self._cert, self._key, *self._client_ca))
            if stamps == self._loaded:
                return False
            try:
                context = self._build()
            except (OSError, ValueError) as error:
                if stamps != self._failed:
                    logger.warning("TLS files not loaded, retrying later: %s", error)
                self._failed = stamps
                return False
            self._current, self._loaded, self._failed = context, stamps, None
        logger.info("serving certificate loaded from %s", self._cert)
        return True

    async def watch(self, interval: float = 1.0) -> None:
        """Check the files every `interval` seconds until cancelled."""
        while True:
            await asyncio.sleep(interval)
            # stat and read in a thread: a slow volume must not stall live sessions.
            await asyncio.to_thread(self.reload_if_changed)

    def _base(self) -> ssl.SSLContext:
        context = _base_context(verify_client=bool(self._client_ca))
        if self._require:
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def _build(self) -> ssl.SSLContext:
        context = self._base()
        for ca in self._client_ca:
            if self._empty_client_ca_ok and os.stat(ca).st_size == 0:
                continue
            context.load_verify_locations(cafile=ca)
        # Fails when the key does not match the certificate.
        context.load_cert_chain(self._cert, self._key, password=_refuse_password)
        return context

    def _select_context(
        self, ssl_object: ssl.SSLObject, server_name: str | None, outer: ssl.SSLContext
    ) -> int | None:
        # Runs inside every handshake, SNI or not: the one moment a connection can still
        # change certificates.
        current = self._current
        if current is None:  # nothing loaded yet: fail the handshake, not the listener
            return ssl.ALERT_DESCRIPTION_INTERNAL_ERROR
        ssl_object.context = current
        return None


def peer_certificate(transport: asyncio.BaseTransport | None) -> x509.Certificate | None:
    """The client's leaf certificate on a TLS connection, or None.

    A certificate is only there when it chained to one of the client CAs (the
    handshake fails otherwise), but not which one: check that before trusting it.
    """
    if transport is None:
        return None
    ssl_object = transport.get_extra_info("ssl_object")
    if not isinstance(ssl_object, ssl.SSLObject | ssl.SSLSocket):
        return None
    der = ssl_object.getpeercert(binary_form=True)
    return None if der is None else x509.load_der_x509_certificate(der)


def _base_context(*, verify_client: bool) -> ssl.SSLContext:
    # Not create_default_context(): that would trust the system CAs for client certificates.
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # aiohttp speaks HTTP/1.1 only, and upgrades (WebSocket, SPDY) need HTTP/1.1 anyway.
    context.set_alpn_protocols(["http/1.1"])
    # No session tickets: a resumed session skips the certificate exchange, so after a
    # reload it would keep an identity checked against CAs no longer trusted.
    context.options |= ssl.OP_NO_TICKET
    context.num_tickets = 0
    if verify_client:
        context.verify_mode = ssl.CERT_OPTIONAL
    return context


def _refuse_password() -> bytes:
    # Without a callback OpenSSL would prompt on the terminal and hang the reload.
    raise ValueError("encrypted private keys are not supported")


def _stamp(path: Path) -> _Stamp:
    try:
        status = os.stat(path)
    except OSError:
        return None
    return (status.st_mtime_ns, status.st_size, status.st_ino)


def replica_caller(transport: asyncio.BaseTransport | None, allowed: frozenset[str]) -> str:
    """The replica identity of a connection's client certificate (a 401 `StatusError` otherwise).

    The node agent and the replicas' peer port admit only replicas: a client
    certificate (from the internal CA, which the handshake demanded) meant
    for client authentication, whose common name is an allowed replica name.
    """
    cert = peer_certificate(transport)
    if cert is None:
        raise StatusError(401, "a replica's request needs a client certificate")
    names = [str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    # One name or none: with several, which one a check reads would decide who gets in.
    name = names[0] if len(names) == 1 else ",".join(names)
    refusal = _not_a_replica(cert, name, allowed)
    if refusal:
        logger.warning(
            "refused a client of the internal CA (serial %x): %s", cert.serial_number, refusal
        )
        raise StatusError(401, refusal)
    return name


def _not_a_replica(cert: x509.Certificate, name: str, allowed: frozenset[str]) -> str:
    """Why `cert` (of the internal CA, named `name`) is no replica's; "" when it is one."""
    try:
        usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        # Every replica certificate says its usages (`subres certs`, cert-manager's): one
        # that says none was made for something else.
        return f"certificate {name!r} names no extended key usage, and a replica's says clientAuth"
    if ExtendedKeyUsageOID.CLIENT_AUTH not in usages:
        return f"certificate {name!r} is not a client certificate"
    if name not in allowed:
        return f"certificate {name!r} is not an allowed replica identity"
    return ""
