"""`subres serve` flags: parsing and validation, no I/O.

The flag names are the ones operators know from kube-apiserver and
sample-apiserver; `Options.validate` reports every problem at once.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from subres.backends import agent
from subres.serving import certs, connections, flags, loops
from subres.serving.flags import duration
from subres.sessions.auditsink import SinkSettings

__all__ = [
    "LOOPBACK",
    "Options",
    "add_arguments",
    "add_operator_arguments",
    "default_cert_dir",
]

LOOPBACK = "127.0.0.1"
"""Where standalone mode listens unless told otherwise: only this machine reaches it."""
EVERYWHERE = "0.0.0.0"
"""Where cluster mode listens by default: kube-apiserver reaches the pod's address."""


def default_cert_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """Where generated certificates go by default: the user's state directory
    (`$XDG_STATE_HOME/subres/certificates`, `~/.local/state/…`), never the working one."""
    state = environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "subres" / "certificates"


@dataclass(frozen=True)
class Options:
    """What the command line said."""

    secure_port: int
    bind_address: str
    cert_dir: Path
    tls_cert_file: Path | None
    tls_private_key_file: Path | None
    client_ca_file: Path | None
    config: Path | None
    standalone: Path | None
    token_auth_file: Path | None
    service_name: str
    service_namespace: str
    authorization_always_allow_paths: tuple[str, ...]
    shutdown_grace: float
    """Seconds, after the delay, for live sessions to end before they are dropped and we exit."""
    connections: connections.Limits = field(default_factory=connections.Limits)
    """`--tls-handshake-timeout`, `--request-header-timeout`, `--idle-timeout`,
    `--max-unauthenticated-connections`."""
    kubeconfig: Path | None = None
    """Cluster mode: kubeconfig of the main apiserver; None means in-cluster."""
    authentication_kubeconfig: Path | None = None
    """Cluster mode: kubeconfig for TokenReview and the ConfigMap; defaults to `kubeconfig`."""
    authorization_kubeconfig: Path | None = None
    """Cluster mode: kubeconfig for SubjectAccessReview; defaults to `kubeconfig`."""
    requestheader_client_ca_file: Path | None = None
    """Front-proxy CA; when set, the `requestheader_*` flags replace the ConfigMap's."""
    requestheader_allowed_names: tuple[str, ...] = ()
    """Front-proxy certificate common names allowed; empty allows any."""
    requestheader_username_headers: tuple[str, ...] = ("X-Remote-User",)
    """Headers naming the user."""
    requestheader_uid_headers: tuple[str, ...] = ()
    """Headers carrying the user's uid."""
    requestheader_group_headers: tuple[str, ...] = ("X-Remote-Group",)
    """Headers carrying groups."""
    requestheader_extra_headers_prefix: tuple[str, ...] = ("X-Remote-Extra-",)
    """Header prefixes of extra attributes."""
    authentication_skip_lookup: bool = False
    """Do not read the authentication ConfigMap for what flags leave out."""
    authentication_tolerate_lookup_failure: bool = False
    """Start even when the authentication ConfigMap cannot be read."""
    authentication_token_webhook_cache_ttl: float = 10.0
    """Seconds TokenReview verdicts are cached."""
    authorization_webhook_cache_authorized_ttl: float = 10.0
    """Seconds allowed SubjectAccessReview verdicts are cached."""
    authorization_webhook_cache_unauthorized_ttl: float = 10.0
    """Seconds denied SubjectAccessReview verdicts are cached."""
    access_log: bool = False
    """Log one line per HTTP request (`--access-log`)."""
    shutdown_delay: float = 5.0
    """Seconds a terminating server keeps serving, not ready, before anything of it moves
    or closes: the time endpoints take to drop it."""
    peer_port: int = 8445
    """Cluster mode: where replicas serve each other (mutual TLS, the replica certificate)."""
    member_duration: float = 6.0
    """Cluster mode: seconds a replica counts as a member after its last Lease renewal."""
    member_renew: float = 2.0
    """Cluster mode: seconds between renewals of this replica's membership Lease."""
    replica_selector: str = "app.kubernetes.io/name=subres,app.kubernetes.io/component=server"
    """Cluster mode: label selector of the replica Pods in the service namespace."""
    replica_name: str = ""
    """Cluster mode: this replica's Pod name (default: the host name, which is the Pod's)."""
    agents: tuple[tuple[str, str], ...] = ()
    """Standalone: (node, https URL) of each node agent (`--agent NODE=URL`)."""
    agent_ca_file: Path | None = None
    """CA of the agents' serving certificates; agents are used only with it."""
    agent_client_cert_file: Path | None = None
    """The client certificate this replica presents to agents."""
    agent_client_key_file: Path | None = None
    agent_server_name: str = ""
    """The name every agent's certificate carries (default subres-agent.<namespace>.svc)."""
    agent_namespace: str = ""
    """Cluster mode: where the agent pods run; empty means `service_namespace`."""
    agent_selector: str = "app.kubernetes.io/name=subres-agent"
    """Cluster mode: label selector of the agent pods in `agent_namespace`."""
    agent_port_name: str = "relay"
    """Cluster mode: name of the agent container's relay port."""
    session_audit_log: str = "-"
    """Where session audit lines go: "-" stdout, "" nowhere, else a file."""
    session_audit_sink: SinkSettings | None = None
    """Where session audit events also go, as CloudEvents (`--session-audit-webhook`)."""
    loop: str = loops.DEFAULT
    """The event loop: uvloop or asyncio (`subres.serving.loops`)."""

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> Options:
        """Options from parsed arguments."""
        return cls(
            secure_port=ns.secure_port,
            bind_address=ns.bind_address or (LOOPBACK if ns.standalone else EVERYWHERE),
            cert_dir=ns.cert_dir or default_cert_dir(),
            tls_cert_file=ns.tls_cert_file,
            tls_private_key_file=ns.tls_private_key_file,
            client_ca_file=ns.client_ca_file,
            config=ns.config,
            standalone=ns.standalone,
            token_auth_file=ns.token_auth_file,
            service_name=ns.service_name,
            service_namespace=ns.service_namespace,
            authorization_always_allow_paths=tuple(
                p for p in ns.authorization_always_allow_paths.split(",") if p
            ),
            shutdown_grace=ns.shutdown_grace,
            connections=connections.Limits.from_args(ns),
            shutdown_delay=ns.shutdown_delay,
            kubeconfig=ns.kubeconfig,
            authentication_kubeconfig=ns.authentication_kubeconfig,
            authorization_kubeconfig=ns.authorization_kubeconfig,
            requestheader_client_ca_file=ns.requestheader_client_ca_file,
            requestheader_allowed_names=_list(ns.requestheader_allowed_names),
            requestheader_username_headers=_list(ns.requestheader_username_headers),
            requestheader_uid_headers=_list(ns.requestheader_uid_headers),
            requestheader_group_headers=_list(ns.requestheader_group_headers),
            requestheader_extra_headers_prefix=_list(ns.requestheader_extra_headers_prefix),
            authentication_skip_lookup=ns.authentication_skip_lookup,
            authentication_tolerate_lookup_failure=ns.authentication_tolerate_lookup_failure,
            authentication_token_webhook_cache_ttl=ns.authentication_token_webhook_cache_ttl,
            authorization_webhook_cache_authorized_ttl=ns.authorization_webhook_cache_authorized_ttl,
            authorization_webhook_cache_unauthorized_ttl=(
                ns.authorization_webhook_cache_unauthorized_ttl
            ),
            access_log=ns.access_log,
            peer_port=ns.peer_port,
            member_duration=ns.member_duration,
            member_renew=ns.member_renew,
            replica_selector=ns.replica_selector,
            replica_name=ns.replica_name,
            agents=tuple(_agent(text) for text in ns.agent or ()),
            agent_ca_file=ns.agent_ca_file,
            agent_client_cert_file=ns.agent_client_cert_file,
            agent_client_key_file=ns.agent_client_key_file,
            agent_server_name=ns.agent_server_name
            or f"{certs.AGENT_SERVICE}.{ns.agent_namespace or ns.service_namespace}.svc",
            agent_namespace=ns.agent_namespace,
            agent_selector=ns.agent_selector,
            agent_port_name=ns.agent_port_name,
            session_audit_log=ns.session_audit_log,
            session_audit_sink=_audit_sink(ns),
            loop=ns.loop,
        )

    def validate(self) -> list[str]:
        """Every problem with these options; empty when they are usable."""
        problems = []
        if not 0 <= self.secure_port <= 65535:
            problems.append(f"--secure-port {self.secure_port} is not a port")
        if (self.tls_cert_file is None) != (self.tls_private_key_file is None):
            problems.append("--tls-cert-file and --tls-private-key-file go together")
        if self.shutdown_grace < 0:
            problems.append("--shutdown-grace must not be negative")
        problems += self.connections.problems()
        if self.shutdown_delay < 0:
            problems.append("--shutdown-delay must not be negative")
        problems += self._mode_problems()
        problems += self._lease_problems()
        if self.session_audit_sink is not None and self.session_audit_sink.spool == Path():
            problems.append("--session-audit-webhook needs --session-audit-spool DIR")
        problems += self._agent_problems()
        for flag, ttl in (
            (
                "--authentication-token-webhook-cache-ttl",
                self.authentication_token_webhook_cache_ttl,
            ),
            (
                "--authorization-webhook-cache-authorized-ttl",
                self.authorization_webhook_cache_authorized_ttl,
            ),
            (
                "--authorization-webhook-cache-unauthorized-ttl",
                self.authorization_webhook_cache_unauthorized_ttl,
            ),
        ):
            if ttl < 0:
                problems.append(f"{flag} must not be negative")
        return problems

    def _lease_problems(self) -> list[str]:
        problems = []
        if self.member_duration < 1 or not self.member_duration.is_integer():
            problems.append("--member-duration must be a whole number of seconds, at least 1s")
        if not 0 < self.member_renew <= self.member_duration / 3:
            problems.append(
                "--member-renew must be above 0 and at most a third of --member-duration"
            )
        if not 0 <= self.peer_port <= 65535:
            problems.append("--peer-port must be a port number")
        return problems

    def _agent_problems(self) -> list[str]:
        problems = []
        files = (self.agent_ca_file, self.agent_client_cert_file, self.agent_client_key_file)
        if any(files) and not all(files):
            problems.append(
                "--agent-ca-file, --agent-client-cert-file and --agent-client-key-file go together"
            )
        for node, url in self.agents:
            try:
                agent.parse_agent_url(url)
            except ValueError as exc:
                problems.append(f"--agent {node}={url}: {exc}")
            if not node:
                problems.append(f"--agent ={url}: want NODE=https://HOST:PORT")
        if self.agents and self.standalone is None:
            problems.append("--agent is for --standalone; in a cluster agents are found by pod")
        return problems

    def _mode_problems(self) -> list[str]:
        """Flags that belong to the other mode (standalone or cluster)."""
        if self.standalone is None:
            if self.token_auth_file is not None:
                return [
                    "--token-auth-file needs --standalone; in a cluster tokens go to TokenReview"
                ]
            return []
        cluster_only = {
            "--kubeconfig": self.kubeconfig,
            "--authentication-kubeconfig": self.authentication_kubeconfig,
            "--authorization-kubeconfig": self.authorization_kubeconfig,
            "--requestheader-client-ca-file": self.requestheader_client_ca_file,
        }
        return [
            f"{flag} is for cluster mode, not --standalone" for flag, v in cluster_only.items() if v
        ]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `serve` flags."""
    add = parser.add_argument
    add("--secure-port", type=int, default=8443, help="HTTPS port (0 picks a free one)")
    add(
        "--bind-address",
        help=f"address to listen on (default: {LOOPBACK} with --standalone, {EVERYWHERE} in a "
        "cluster, where kube-apiserver must reach it)",
    )
    add(
        "--cert-dir",
        type=Path,
        help="where generated certificates go when no --tls-cert-file is given, in a directory "
        "only you may enter (default: $XDG_STATE_HOME/subres/certificates, "
        "~/.local/state/subres/certificates)",
    )
    add("--tls-cert-file", type=Path, help="serving certificate (PEM), re-read when it changes")
    add("--tls-private-key-file", type=Path, help="serving key (PEM)")
    add("--client-ca-file", type=Path, help="CA bundle for client-certificate authentication")
    add("--config", type=Path, help="configuration file (YAML); defaults to the Machine CRD")
    add(
        "--standalone",
        type=Path,
        metavar="FILE",
        help="read parent objects from this multi-document YAML file instead of an apiserver",
    )
    add("--token-auth-file", type=Path, help='static tokens: token,user,uid,"group1,group2"')
    add("--service-name", default="subres", help="Service name for generated certificate SANs")
    add("--service-namespace", default="subres-system", help="Service namespace for the SANs")
    add(
        "--authorization-always-allow-paths",
        default="/healthz,/readyz,/livez,/ui,/ui/*",
        help="comma-separated paths anyone may GET (a trailing * matches a prefix); "
        "the browser page under /ui holds no secrets",
    )
    add(
        "--session-audit-log",
        default="-",
        metavar="PATH",
        help='one JSON line per session start and end: "-" for stdout (the default), '
        "a file to append to, or an empty string for none",
    )
    _add_audit_sink_arguments(parser)
    _add_cluster_arguments(parser)
    _add_agent_arguments(parser)
    add(
        "--shutdown-delay",
        type=duration,
        default=5.0,
        help="on SIGTERM, keep serving this long with /readyz failing, so that endpoints "
        "drop this replica before its sessions are moved or closed and its listener closes "
        "(default 5s; a second signal skips it)",
    )
    add(
        "--shutdown-grace",
        type=duration,
        default=5.0,
        help="then, how long live sessions get to end after being told (close code 1001); "
        "the server exits within --shutdown-delay plus this, whatever the sessions do",
    )
    connections.add_arguments(parser)
    add_operator_arguments(parser)
    loops.add_argument(parser)


def add_operator_arguments(parser: argparse.ArgumentParser) -> None:
    """What an operator tunes about the output (shared by `serve` and `demo`)."""
    parser.add_argument(
        "--access-log", action="store_true", help="log one line per HTTP request (default off)"
    )
    parser.add_argument(
        "--logging-format",
        choices=("text", "json"),
        default="text",
        help="text (default), or json: one object per line as Kubernetes components write it",
    )


def _add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of cluster mode (no --standalone), named as in kube's delegating options."""
    add = parser.add_argument
    add("--kubeconfig", type=Path, help="kubeconfig of the main apiserver (default: in-cluster)")
    add(
        "--authentication-kubeconfig",
        type=Path,
        help="kubeconfig for TokenReview and the ConfigMap",
    )
    add("--authorization-kubeconfig", type=Path, help="kubeconfig for SubjectAccessReview")
    add(
        "--requestheader-client-ca-file",
        type=Path,
        help="front-proxy CA; with it the --requestheader-* flags replace the cluster's ConfigMap",
    )
    add(
        "--requestheader-allowed-names",
        default="",
        help="allowed proxy common names (any if empty)",
    )
    add("--requestheader-username-headers", default="X-Remote-User", help="user name headers")
    add("--requestheader-uid-headers", default="", help="uid headers")
    add("--requestheader-group-headers", default="X-Remote-Group", help="group headers")
    add("--requestheader-extra-headers-prefix", default="X-Remote-Extra-", help="extra prefixes")
    add(
        "--authentication-skip-lookup",
        action="store_true",
        help="do not read kube-system/extension-apiserver-authentication",
    )
    add(
        "--authentication-tolerate-lookup-failure",
        action="store_true",
        help="start even if kube-system/extension-apiserver-authentication cannot be read",
    )
    add(
        "--peer-port",
        type=int,
        default=8445,
        help="port where replicas serve each other over mutual TLS (0: any free port)",
    )
    add(
        "--member-duration",
        type=duration,
        default=6.0,
        help="how long a replica counts as a member after its last Lease renewal "
        "(whole seconds; a dead replica's consoles move after this)",
    )
    add(
        "--member-renew",
        type=duration,
        default=2.0,
        help="how often a replica renews its membership Lease (at most a third of "
        "--member-duration)",
    )
    add(
        "--replica-selector",
        default="app.kubernetes.io/name=subres,app.kubernetes.io/component=server",
        help="label selector of the replica Pods in --service-namespace",
    )
    add(
        "--replica-name",
        default="",
        help="this replica's Pod name (default: the host name, which is the Pod's)",
    )
    for flag in (
        "--authentication-token-webhook-cache-ttl",
        "--authorization-webhook-cache-authorized-ttl",
        "--authorization-webhook-cache-unauthorized-ttl",
    ):
        add(flag, type=duration, default=10.0, help="how long verdicts are cached (e.g. 10s, 1m)")


def _add_agent_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags for reaching node agents."""
    add = parser.add_argument
    add(
        "--agent",
        action="append",
        metavar="NODE=URL",
        help="standalone: the agent of NODE at https://HOST:PORT (repeatable)",
    )
    add("--agent-ca-file", type=Path, help="CA of the node agents' serving certificates")
    add("--agent-client-cert-file", type=Path, help="client certificate presented to agents")
    add("--agent-client-key-file", type=Path, help="its key")
    add(
        "--agent-server-name",
        default="",
        help="name the agents' certificates carry (default subres-agent.<agent namespace>.svc)",
    )
    add(
        "--agent-namespace",
        default="",
        help="cluster mode: the agent pods' namespace (default --service-namespace)",
    )
    add(
        "--agent-selector",
        default="app.kubernetes.io/name=subres-agent",
        help="cluster mode: label selector of the agent pods in --agent-namespace",
    )
    add("--agent-port-name", default="relay", help="cluster mode: the agents' relay port name")


def _agent(text: str) -> tuple[str, str]:
    node, _, url = text.partition("=")
    return node.strip(), url.strip()


def _list(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.split(",") if p.strip())


def _add_audit_sink_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add(
        "--session-audit-webhook",
        default="",
        metavar="URL",
        help="also send each session audit line to this URL, as CloudEvents in batches "
        "(application/cloudevents-batch+json), spooled on disk until the sink takes them",
    )
    add(
        "--session-audit-spool",
        type=Path,
        metavar="DIR",
        help="where audit events wait for the webhook (required with it; an emptyDir keeps "
        "them through a container's restart)",
    )
    add(
        "--session-audit-spool-max",
        type=flags.size,
        default=SinkSettings.max_bytes,
        metavar="SIZE",
        help="bytes the spool may hold (e.g. 256Mi); past it new events are dropped and counted",
    )
    add("--session-audit-webhook-ca", type=Path, metavar="FILE", help="CA of an https sink")
    add(
        "--session-audit-webhook-token-file",
        type=Path,
        metavar="FILE",
        help="a bearer token for the sink, read again on every retry",
    )


def _audit_sink(ns: argparse.Namespace) -> SinkSettings | None:
    if not ns.session_audit_webhook:
        return None
    return SinkSettings(
        url=ns.session_audit_webhook,
        spool=ns.session_audit_spool or Path(),  # no spool: validate() says so
        max_bytes=ns.session_audit_spool_max,
        ca_file=ns.session_audit_webhook_ca,
        token_file=ns.session_audit_webhook_token_file,
    )
