"""Cluster mode: the parts that talk to the main apiserver, built and run together.

Builds, from validated options, the apiserver clients (main, authentication,
authorization), the authentication configuration (read at start from the
cluster's ConfigMap unless flags give it all), the delegating authenticator
and webhook authorizer, one informer per parent CRD plus one for the
ConfigMap, the replica membership (this replica's Lease, and the watches of
every replica's Lease and Pod that decide who owns each console), and, when
agents are configured, one informer for the agent pods. `Cluster` starts
those informers and stops them and the clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field

from subres.auth.authconfig import (
    CONFIGMAP,
    NAMESPACE,
    AuthenticationFiles,
    AuthenticationSource,
)
from subres.auth.delegating import DelegatingAuthenticator
from subres.auth.requestheader import RequestHeaderConfig
from subres.auth.webhook import (
    AuthorizerSettings,
    TokenReviewAuthenticator,
    TokenReviewSettings,
    WebhookAuthorizer,
)
from subres.config import Config
from subres.kube import client
from subres.kube.agents import AgentPods
from subres.kube.cache import ParentCache
from subres.kube.informer import Informer, InformerSettings
from subres.server.options import Options
from subres.sessions.members import Membership, MembershipSettings, Owners

__all__ = ["Cluster", "build"]

log = logging.getLogger(__name__)


@dataclass
class Cluster:
    """Everything cluster mode runs beside the listener."""

    caches: Mapping[str, ParentCache]
    """Parent caches by resource, fed by the informers."""
    auth: AuthenticationSource
    """The authentication configuration in force."""
    authenticator: DelegatingAuthenticator
    authorizer: WebhookAuthorizer
    informers: tuple[Informer, ...]
    membership: Membership | None
    """This replica's Lease and its view of the others; None without the replica
    certificate, which other replicas would need to reach it: then it serves alone."""
    owners: Owners
    """Who owns each unit, as this replica sees the members (alone: itself)."""
    apis: tuple[client.Api, ...]
    """Every distinct client, closed on stop."""
    agents: AgentPods | None = None
    """Where each node's agent is (None when no agent certificate is configured)."""
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def main(self) -> client.Api:
        """The client of the main apiserver (parents, Events)."""
        return self.apis[0]

    async def start(self) -> None:
        """Start the informers and the membership."""
        self._tasks = [asyncio.create_task(i.run(), name=i.name) for i in self.informers]
        if self.membership is not None:
            await self.membership.start()

    @property
    def synced(self) -> bool:
        """The replicas were listed and this replica's Lease written (alone: at once)."""
        return self.membership is None or self.membership.synced

    async def leave(self) -> None:
        """The drain started: delete this replica's Lease, so that its units move now."""
        if self.membership is not None:
            await self.membership.leave()

    async def stop(self, *, grace: float) -> None:
        """Leave the members (waiting at most `grace`), stop informers and clients."""
        if self.membership is not None:
            await self.membership.stop(grace=grace)
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks)
        await _close(self.apis)


async def build(
    options: Options, config: Config, *, informers: InformerSettings | None = None
) -> Cluster:
    """Connect, read the authentication configuration and build the parts (not started)."""
    apis = await _connect(options)
    try:
        return await _assemble(options, config, apis=apis, settings=informers)
    except BaseException:
        await _close(tuple(dict.fromkeys(apis)))
        raise


async def _connect(options: Options) -> tuple[client.Api, client.Api, client.Api]:
    """The main, authentication and authorization clients (the latter two default to main)."""
    made: list[client.Api] = []
    try:
        made.append(await client.connect(options.kubeconfig))
        for path in (options.authentication_kubeconfig, options.authorization_kubeconfig):
            made.append(await client.connect(path) if path is not None else made[0])
    except BaseException:
        await _close(tuple(dict.fromkeys(made)))
        raise
    return made[0], made[1], made[2]


async def _assemble(
    options: Options,
    config: Config,
    *,
    apis: tuple[client.Api, client.Api, client.Api],
    settings: InformerSettings | None,
) -> Cluster:
    main, authn_api, authz_api = apis
    auth = AuthenticationSource(_files(options))
    informers = []
    if auth.needs_lookup:
        await auth.load(authn_api, tolerate=options.authentication_tolerate_lookup_failure)
        configmaps = client.ConfigMaps(authn_api, NAMESPACE, f"metadata.name={CONFIGMAP}")
        informers.append(
            Informer(
                source=configmaps, sink=auth, name=f"{NAMESPACE}/{CONFIGMAP}", settings=settings
            )
        )
    caches = {p.resource: ParentCache(p.resource) for p in config.parents}
    for parent in config.parents:
        objects = client.CustomObjects(main, parent.group, parent.version, parent.crd_resource)
        name = f"{parent.crd_resource}.{parent.group}"
        informers.append(
            Informer(source=objects, sink=caches[parent.resource], name=name, settings=settings)
        )
    agents = None
    if options.agent_ca_file is not None:
        agents = AgentPods(options.agent_port_name)
        namespace = options.agent_namespace or options.service_namespace
        pods = client.Pods(main, namespace, options.agent_selector)
        name = f"{namespace}/pods {options.agent_selector}"
        informers.append(Informer(source=pods, sink=agents, name=name, settings=settings))
    tokens = TokenReviewAuthenticator(
        authn_api,
        TokenReviewSettings(
            success_ttl=options.authentication_token_webhook_cache_ttl,
            failure_ttl=options.authentication_token_webhook_cache_ttl,
        ),
    )
    authorizer = WebhookAuthorizer(
        authz_api,
        AuthorizerSettings(
            allowed_ttl=options.authorization_webhook_cache_authorized_ttl,
            denied_ttl=options.authorization_webhook_cache_unauthorized_ttl,
            always_allow_paths=options.authorization_always_allow_paths,
        ),
    )
    replica = options.replica_name or socket.gethostname()
    membership = (
        None
        if not _has_replica_certificate(options)
        else Membership(
            main,
            MembershipSettings(
                namespace=options.service_namespace,
                replica=replica,
                selector=options.replica_selector,
                peer_port=options.peer_port,
                duration=options.member_duration,
                renew=options.member_renew,
            ),
            Owners(replica),
            informer=settings,
        )
    )
    return Cluster(
        caches=caches,
        auth=auth,
        authenticator=DelegatingAuthenticator(config=auth, tokens=tokens),
        authorizer=authorizer,
        informers=tuple(informers),
        membership=membership,
        owners=membership.owners if membership is not None else Owners.alone(replica),
        apis=tuple(dict.fromkeys(apis)),
        agents=agents,
    )


def _has_replica_certificate(options: Options) -> bool:
    if options.agent_ca_file and options.agent_client_cert_file and options.agent_client_key_file:
        return True
    log.warning(
        "no replica certificate (--agent-client-cert-file): this replica serves alone; "
        "give every replica one to make them one system (docs/replicas.md)"
    )
    return False


def _files(options: Options) -> AuthenticationFiles:
    return AuthenticationFiles(
        directory=options.cert_dir,
        client_ca_file=options.client_ca_file,
        requestheader_client_ca_file=options.requestheader_client_ca_file,
        requestheader=RequestHeaderConfig(
            allowed_names=options.requestheader_allowed_names,
            username_headers=options.requestheader_username_headers,
            uid_headers=options.requestheader_uid_headers,
            group_headers=options.requestheader_group_headers,
            extra_headers_prefixes=options.requestheader_extra_headers_prefix,
        ),
        skip_lookup=options.authentication_skip_lookup,
    )


async def _close(apis: tuple[client.Api, ...]) -> None:
    for api in apis:
        # Best effort while shutting down or failing: one client's error must not leak the rest.
        with contextlib.suppress(Exception):
            await api.close()
