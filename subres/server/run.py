"""Running the server: Options → Complete (read files, build parts) → Run.

`Server` is what `subres serve`, `subres demo` and the tests start; it owns
the listener, the background watchers and an orderly shutdown. `complete`
builds standalone mode; `complete_cluster` builds cluster mode, whose
apiserver-facing parts live in `subres.server.cluster`.

Shutdown (`serve`, on SIGTERM or SIGINT): `/readyz` fails at once; the server
keeps serving, and owning its units, for `--shutdown-delay` (a second signal
cuts it short) so that endpoints stop sending it requests before anything
moves or closes; then it deletes its membership Lease, so that its units
move to the others and its sessions on them end with 1001 (their clients
come back through a replica that stays); then `Server.stop` takes at most
`--shutdown-grace`: it stops accepting, tells every live session the server
is going away (1001), waits for them to end until a last step before the
deadline, drops the connections of any that did not (a client that reads
nothing, a peer that never hangs up), lets aiohttp finish the other
requests, and stops watching in what remains.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from aiohttp import web

from subres import config as configfile
from subres.auth.authn import Authenticator
from subres.auth.authz import StandaloneAuthorizer
from subres.auth.cafile import CAFile
from subres.auth.tokenfile import TokenFile
from subres.backends.agent import Agents, ClientTLS, Directory, StaticDirectory
from subres.engine import internals
from subres.kube.cache import ParentCache
from subres.kube.informer import InformerSettings
from subres.kube.secrets import ApiSecrets, CachedSecrets
from subres.kube.standalone import FileSource
from subres.server import app as application
from subres.server import cluster, peer
from subres.server.options import Options
from subres.server.state import State
from subres.serving import certs, connections
from subres.serving.metrics import Metrics
from subres.serving.tls import ReloadingTLS
from subres.sessions import audit
from subres.sessions.audit import SessionAudit
from subres.sessions.auditsink import WebhookSink
from subres.sessions.events import KubeEvents

__all__ = ["Background", "Reloadable", "Server", "complete", "complete_cluster", "serve"]

log = logging.getLogger(__name__)

WATCH_INTERVAL = 1.0
"""Seconds between checks of the certificate, token, CA and standalone files."""
LAST_STEP = 1.0
"""Seconds of the shutdown grace (at most half of it) kept for after the sessions:
finishing other requests, deleting this replica's membership Lease."""
GOING_AWAY = "the server is shutting down"


class Reloadable(Protocol):
    """Something that follows files, checked every `WATCH_INTERVAL` in a worker thread."""

    def reload_if_changed(self) -> object:
        """Re-read (or write) what changed."""
        ...


class Background(Protocol):
    """Work that runs beside the listener (cluster mode's informers)."""

    async def start(self) -> None:
        """Start it, before the listener opens."""
        ...

    async def stop(self, *, grace: float) -> None:
        """Stop it within `grace` seconds, after the listener closed."""
        ...

    async def leave(self) -> None:
        """The shutdown delay is over: give this replica's units to the others now."""
        ...


@dataclass
class Server:
    """A built server, ready to start."""

    options: Options
    state: State
    tls: ReloadingTLS
    source: Reloadable
    """Polled before the TLS files: the standalone parents file, or in cluster mode the
    authentication configuration (it writes the CA files the TLS context trusts)."""
    polled: tuple[Reloadable, ...] = ()
    """Further things to poll (standalone: the token and client CA files)."""
    background: Background | None = None
    peer_tls: ReloadingTLS | None = None
    """Cluster mode: the peer port's TLS (the replica certificate, replica clients only)."""
    runner: web.AppRunner | None = None
    peer_runner: web.AppRunner | None = None
    port: int = 0
    peer_port: int = 0
    _watcher: asyncio.Task[None] | None = None

    async def start(self) -> int:
        """Listen and start the watchers; the port actually bound."""
        if self.background is not None:
            await self.background.start()
        internals.share_ssl_read_buffer()
        self.runner = web.AppRunner(
            application.build(self.state),
            handle_signals=False,
            shutdown_timeout=self.options.shutdown_grace,
            # A lost client connection cancels its handler: a session whose
            # client vanished ends even while its backend blocks (`session.Live.run`).
            handler_cancellation=True,
            # One line per request only when asked for (--access-log): a page load alone
            # is dozens of requests.
            access_log=logging.getLogger("aiohttp.access") if self.options.access_log else None,
        )
        self.port = await self._listen(self.runner, self.options.secure_port, self.tls)
        if self.peer_tls is not None:
            await self._start_peer(self.peer_tls)
        self._watcher = asyncio.create_task(self._watch())
        self.state.reclaimer.start()
        log.info("serving on https://%s:%d", self.options.bind_address, self.port)
        return self.port

    async def _start_peer(self, tls: ReloadingTLS) -> None:
        self.peer_runner = web.AppRunner(
            peer.build(self.state), handle_signals=False, handler_cancellation=True, access_log=None
        )
        self.peer_port = await self._listen(self.peer_runner, self.options.peer_port, tls)
        log.info("serving replicas on https://%s:%d", self.options.bind_address, self.peer_port)

    async def _listen(self, runner: web.AppRunner, port: int, tls: ReloadingTLS) -> int:
        """Set `runner` up behind its application's connection guard on `port`; the port
        actually bound."""
        await runner.setup()
        site = connections.GuardedSite(
            runner,
            host=self.options.bind_address,
            port=port,
            ssl_context=tls.context,
            backlog=1024,
        )
        await site.start()
        return int(runner.addresses[-1][1])

    async def drain(self, *, cut_short: asyncio.Event) -> None:
        """Fail readiness, keep serving for the shutdown delay, leave the members, stop.

        Serving goes on, units and sessions included, for `--shutdown-delay`
        (or until `cut_short`) so that endpoints and kube-apiserver stop
        sending requests here first: a client told to reconnect then reaches
        a replica that stays. Only then do this replica's units move to the
        others (its sessions on them end with 1001) and its other sessions end.
        """
        self.state.draining = True
        log.info("shutting down: not ready; serving %.1fs more", self.options.shutdown_delay)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.options.shutdown_delay):
                await cut_short.wait()
        if self.background is not None:
            await self.background.leave()
        await self.stop()

    async def stop(self) -> None:
        """Stop accepting, end live sessions (1001), stop the watchers: within the grace."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.options.shutdown_grace
        last = min(LAST_STEP, self.options.shutdown_grace / 2)
        if self._watcher is not None:
            self._watcher.cancel()
            await asyncio.wait([self._watcher])
        if self.runner is not None:
            for site in list(self.runner.sites):
                await site.stop()
            await self._end_sessions(until=deadline - last)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(deadline - last / 2):
                    await self.runner.cleanup()
                    if self.peer_runner is not None:
                        await self.peer_runner.cleanup()
        await self.state.reclaimer.stop()
        if self.background is not None:
            await self.background.stop(grace=max(0.0, deadline - loop.time()))

    async def _end_sessions(self, *, until: float) -> None:
        """Tell every live session to go; drop the connections of those left at `until`."""
        sessions = self.state.sessions
        closing = asyncio.create_task(sessions.close_all(GOING_AWAY))
        try:
            async with asyncio.timeout_at(until):
                await sessions.ended()
        except TimeoutError:
            log.warning("dropping %d sessions still open at the end of the grace", len(sessions))
            sessions.drop_all()
        closing.cancel()  # a close frame stuck behind a client that reads nothing
        await asyncio.wait([closing])

    async def _watch(self) -> None:
        while True:
            await asyncio.to_thread(self._reload)
            await asyncio.sleep(WATCH_INTERVAL)

    def _reload(self) -> None:
        self.source.reload_if_changed()
        for polled in self.polled:
            polled.reload_if_changed()
        self.tls.reload_if_changed()
        if self.peer_tls is not None:
            self.peer_tls.reload_if_changed()
        self.state.tls_ready = self.tls.ready


def complete(options: Options) -> Server:
    """Read every file the options name and build the server (raises on bad input)."""
    config = configfile.load(options.config)
    cert, key = _serving_pair(options)
    client_cas = [options.client_ca_file] if options.client_ca_file else []
    tls = ReloadingTLS(cert=cert, key=key, client_ca=client_cas)
    caches = {p.resource: ParentCache(p.resource) for p in config.parents}
    if options.standalone is None:
        raise ValueError("--standalone FILE is required; use complete_cluster without it")
    secrets = ParentCache("secrets")
    source = FileSource(options.standalone, caches, config.parents, secrets=secrets)
    source.reload_if_changed()
    metrics = Metrics()
    authenticator = Authenticator(
        tokens=TokenFile(options.token_auth_file) if options.token_auth_file else None,
        client_ca=CAFile(options.client_ca_file) if options.client_ca_file else None,
    )
    state = State(
        config=config,
        caches=caches,
        authenticator=authenticator,
        authorizer=StandaloneAuthorizer(options.authorization_always_allow_paths),
        parents_file=options.standalone,
        tls_ready=tls.ready,
        secrets=CachedSecrets(secrets),
        connections=connections.Guard(options.connections),
        agents=_agents(options, StaticDirectory(dict(options.agents))),
        metrics=metrics,
        audit=_audit(options, metrics=metrics, source="subres"),
    )
    return Server(options=options, state=state, tls=tls, source=source, polled=(authenticator,))


def _audit(options: Options, *, metrics: Metrics, source: str) -> SessionAudit:
    """The audit lines' stream, and the webhook sink when one is configured."""
    settings = options.session_audit_sink
    sink = None if settings is None else WebhookSink(settings, metrics=metrics)
    return SessionAudit(audit.open_log(options.session_audit_log), sink=sink, source=source)


async def complete_cluster(
    options: Options, *, informers: InformerSettings | None = None
) -> Server:
    """Connect to the main apiserver, read the authentication configuration, build the server.

    Raises when the apiserver or the authentication ConfigMap cannot be read
    (unless told to tolerate the latter).
    """
    config = configfile.load(options.config)
    cert, key = _serving_pair(options)
    parts = await cluster.build(options, config, informers=informers)
    # The CA files the ConfigMap names must exist before the TLS context reads them.
    await asyncio.to_thread(parts.auth.reload_if_changed)
    tls = ReloadingTLS(cert=cert, key=key, client_ca=parts.auth.ca_paths, empty_client_ca_ok=True)
    metrics = Metrics()
    replica = options.replica_name or socket.gethostname()
    state = State(
        config=config,
        caches=parts.caches,
        authenticator=parts.authenticator,
        authorizer=parts.authorizer,
        tls_ready=tls.ready,
        connections=connections.Guard(options.connections),
        readiness=_readiness(parts),
        secrets=ApiSecrets(parts.main),
        agents=_agents(options, parts.agents or StaticDirectory({})),
        owners=parts.owners,
        peer_tls=_client_tls(options, peer.REPLICA_NAME),
        metrics=metrics,
        audit=_audit(options, metrics=metrics, source=f"subres/{replica}"),
        events=KubeEvents(parts.main, metrics=metrics, instance=replica),
        replica=replica,
    )
    state.metrics.watch_caches(
        {
            "tokenreview": parts.authenticator.tokens.cache,
            "subjectaccessreview": parts.authorizer.cache,
        }
    )
    return Server(
        options=options,
        state=state,
        tls=tls,
        source=parts.auth,
        background=parts,
        peer_tls=_peer_serving(options),
    )


def _readiness(parts: cluster.Cluster) -> dict[str, Callable[[], bool]]:
    """Cluster mode's /readyz checks beyond TLS and the parent caches."""
    checks: dict[str, Callable[[], bool]] = {
        "authentication-config": lambda: parts.auth.ready,
        "replica-membership": lambda: parts.synced,
    }
    agents = parts.agents
    if agents is not None:
        # Until the agent pods are listed, every node would look agentless (503).
        checks["agent-pods"] = lambda: agents.synced
    return checks


def _replica_files(options: Options) -> tuple[Path, Path, Path] | None:
    """The replica certificate, its key and the internal CA, when all three are given."""
    cert, key, ca = (
        options.agent_client_cert_file,
        options.agent_client_key_file,
        options.agent_ca_file,
    )
    return (cert, key, ca) if cert and key and ca else None


def _client_tls(options: Options, server_name: str) -> ClientTLS | None:
    """The replica certificate as a client of servers named `server_name` (agents, peers)."""
    files = _replica_files(options)
    if files is None:
        return None
    cert, key, ca = files
    return ClientTLS(cert=cert, key=key, ca=ca, server_name=server_name)


def _agents(options: Options, directory: Directory) -> Agents:
    """How node-local endpoints are reached: agents need the client certificate files."""
    return Agents(directory=directory, tls=_client_tls(options, options.agent_server_name))


def _peer_serving(options: Options) -> ReloadingTLS | None:
    """The peer port's TLS: the replica certificate, and only its CA's clients."""
    files = _replica_files(options)
    if files is None:
        return None
    cert, key, ca = files
    return ReloadingTLS(cert=cert, key=key, client_ca=[ca], require_client_cert=True)


def _serving_pair(options: Options) -> tuple[Path, Path]:
    if options.tls_cert_file and options.tls_private_key_file:
        return options.tls_cert_file, options.tls_private_key_file
    files = certs.ensure_self_signed(
        options.cert_dir, service=options.service_name, namespace=options.service_namespace
    )
    return files.cert, files.key


async def serve(options: Options) -> None:
    """Run until SIGTERM or SIGINT, then shut down in order."""
    connections.raise_open_files_limit()
    server = complete(options) if options.standalone else await complete_cluster(options)
    signalled = [asyncio.Event(), asyncio.Event()]

    def on_signal() -> None:
        # The first signal starts the shutdown; a second one cuts its delay short.
        next((e for e in signalled if not e.is_set()), signalled[-1]).set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    await server.start()
    try:
        await signalled[0].wait()
    finally:
        await server.drain(cut_short=signalled[1])
