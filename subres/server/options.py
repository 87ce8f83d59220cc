"""`subres serve` flags: parsing and validation, no I/O.

The flag names are the ones operators know from kube-apiserver and
sample-apiserver; `Options.validate` reports every problem at once.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Options", "add_arguments"]


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

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> Options:
        """Options from parsed arguments."""
        return cls(
            secure_port=ns.secure_port,
            bind_address=ns.bind_address,
            cert_dir=ns.cert_dir,
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
        )

    def validate(self) -> list[str]:
        """Every problem with these options; empty when they are usable."""
        problems = []
        if not 0 <= self.secure_port <= 65535:
            problems.append(f"--secure-port {self.secure_port} is not a port")
        if (self.tls_cert_file is None) != (self.tls_private_key_file is None):
            problems.append("--tls-cert-file and --tls-private-key-file go together")
        if self.standalone is None:
            problems.append(
                "--standalone FILE is required: watching a main apiserver is not available yet"
            )
        if self.shutdown_grace < 0:
            problems.append("--shutdown-grace must not be negative")
        return problems


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `serve` flags."""
    add = parser.add_argument
    add("--secure-port", type=int, default=8443, help="HTTPS port (0 picks a free one)")
    add("--bind-address", default="0.0.0.0", help="address to listen on")
    add(
        "--cert-dir",
        type=Path,
        default=Path("apiserver.local.config/certificates"),
        help="where generated certificates go when no --tls-cert-file is given",
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
        default="/healthz,/readyz,/livez",
        help="comma-separated paths anyone may GET (a trailing * matches a prefix)",
    )
    add(
        "--shutdown-grace",
        type=float,
        default=5.0,
        help="seconds live sessions get to close on SIGTERM",
    )
