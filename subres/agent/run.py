"""Running `subres agent`: Options → policy and TLS → one HTTPS route → until SIGTERM.

The listener demands a client certificate from the replicas' CA (mutual
TLS); the serving certificate and the CA are re-read when their files change
(cert-manager rotates them), without dropping live relays. Every connection
has the server's timers and unauthenticated cap (`serving.connections`): a
connection that never finishes TLS, never sends a request or idles is
closed, and it counts as authenticated once a request passed the caller
check.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import ipaddress
import logging
import os
import signal
import sys

from aiohttp import web

from subres.agent import relay
from subres.agent.options import AgentOptions
from subres.backends import nofollow
from subres.backends.addresses import IPNetwork
from subres.config import EndpointPolicySpec
from subres.engine import internals
from subres.protocol import relay as wire
from subres.serving import connections, errors, loops, tls

__all__ = ["GUARD", "Agent", "build", "main", "policy", "serve", "socket_dirs"]

log = logging.getLogger(__name__)

SHUTDOWN_GRACE = 5.0
"""Seconds the relays, told to end, get to close when the agent stops."""
GUARD = connections.GUARD
"""The application's connection guard (timeouts and the unauthenticated cap)."""


def policy(options: AgentOptions) -> EndpointPolicySpec:
    """The agent's own endpoint policy: its socket directories, and TCP/UDP only if allowed."""
    networks = tuple(ipaddress.ip_network(cidr) for cidr in options.allow_tcp)
    return EndpointPolicySpec(
        schemes=("unix", "tcp") if networks else ("unix",),
        allow_cidrs=networks,
        deny_cidrs=_denied(networks),
        # Resolved once: a symlinked directory is checked as where it leads, as every path is.
        socket_dirs=tuple(os.path.realpath(d) for d in options.socket_dirs),
    )


def _denied(allowed: tuple[IPNetwork, ...]) -> tuple[IPNetwork, ...]:
    """The default denies, but for those an `--allow-tcp` names a part of: an operator who
    allows 127.0.0.0/8 means the node's loopback; one who allows 0.0.0.0/0 still does not
    reach the metadata service."""
    default = EndpointPolicySpec().deny_cidrs
    return tuple(deny for deny in default if not any(_within(a, deny) for a in allowed))


def _within(inner: IPNetwork, outer: IPNetwork) -> bool:
    if isinstance(inner, ipaddress.IPv4Network) and isinstance(outer, ipaddress.IPv4Network):
        return inner.subnet_of(outer)
    if isinstance(inner, ipaddress.IPv6Network) and isinstance(outer, ipaddress.IPv6Network):
        return inner.subnet_of(outer)
    return False


def socket_dirs(options: AgentOptions) -> tuple[nofollow.SocketDir, ...]:
    """The socket directories: as named, their real paths, and who must own their sockets
    (the directory's owner unless `--socket-dir DIR=UID[:GID]` says)."""
    dirs = []
    for directory in options.socket_dirs:
        real = os.path.realpath(directory)
        uid, gid = options.socket_owners.get(directory, (os.stat(real).st_uid, None))
        dirs.append(nofollow.SocketDir(os.path.normpath(directory), real, uid, gid))
        log.info("sockets under %s must belong to %s", directory, dirs[-1].owner())
    return tuple(dirs)


def build(options: AgentOptions) -> web.Application:
    """The agent's application: `POST /relay` and nothing else."""
    settings = relay.Relay(
        node=options.node_name,
        policy=policy(options),
        socket_dirs=socket_dirs(options),
        allowed_names=frozenset(options.allowed_names),
        connect_timeout=options.connect_timeout,
        read_size=options.read_size,
        write_timeout=options.write_timeout,
    )
    app = connections.Guard(options.connections).application(
        [errors.errors, relay.identity(settings)],
        authenticated=relay.authenticated,
        client_max_size=0,
    )
    app.router.add_route("POST", wire.PATH, functools.partial(relay.handle, settings))

    async def stopping(_: web.Application) -> None:
        # Once it stopped listening: told now, a replica keeping a console dials it
        # again (through the node's next agent) without waiting out the grace.
        relay.end_all(settings)

    app.on_shutdown.append(stopping)
    return app


class Agent:
    """A running agent: its TLS files, its listener, its port."""

    def __init__(self, options: AgentOptions) -> None:
        self.options = options
        self.tls = tls.ReloadingTLS(
            cert=options.tls_cert_file,
            key=options.tls_private_key_file,
            client_ca=[options.client_ca_file],
            require_client_cert=True,
        )
        self.runner = web.AppRunner(
            build(options), handle_signals=False, shutdown_timeout=SHUTDOWN_GRACE
        )
        self.port = 0
        self._watcher: asyncio.Task[None] | None = None

    async def start(self) -> int:
        """Listen; the port actually bound."""
        # The same listener recipe as `subres serve`'s Server.start, for another app and
        # TLS context; the replica's also starts informers and file watchers around it.
        internals.share_ssl_read_buffer()
        await self.runner.setup()
        site = connections.GuardedSite(
            self.runner,
            host=self.options.bind_address,
            port=self.options.port,
            ssl_context=self.tls.context,
            backlog=1024,
        )
        await site.start()
        self.port = int(self.runner.addresses[0][1])
        self._watcher = asyncio.create_task(self.tls.watch())
        log.info(
            "agent for node %s serving on https://%s:%d",
            self.options.node_name,
            self.options.bind_address,
            self.port,
        )
        return self.port

    async def stop(self) -> None:
        """Stop listening and end live relays, each replica told why at once."""
        if self._watcher is not None:
            self._watcher.cancel()
            await asyncio.wait([self._watcher])
        await self.runner.cleanup()


async def serve(options: AgentOptions) -> None:
    """Run until SIGTERM or SIGINT."""
    connections.raise_open_files_limit()
    agent = Agent(options)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await agent.start()
    try:
        await stop.wait()
    finally:
        log.info("shutting down")
        await agent.stop()


def main(ns: argparse.Namespace) -> int:
    """`subres agent`: check the flags, then serve until SIGTERM; the exit code."""
    options = AgentOptions.from_args(ns)
    problems = options.validate()
    for problem in problems:
        print(f"subres agent: {problem}", file=sys.stderr)
    if problems:
        return 2
    try:
        loops.run(serve(options), loop=options.loop)
    except OSError as exc:
        # A busy port or unreadable files are the operator's to fix: say what.
        print(f"subres agent: {exc}", file=sys.stderr)
        return 1
    return 0
