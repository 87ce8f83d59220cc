"""`subres demo`: the whole product on one machine, no cluster needed.

Claims the state directory (a second demo there refuses before it touches
anything: `subres.demo.claim`), writes it (certificates, a random token, a
kubeconfig, the machines file with the Secret of the console's SSH key, the
config), starts the demo machine's console (a shell in a PTY behind an SSH
server on loopback, so that window sizes reach it), its display (a small VNC
server on a unix socket), its web page (the port-forward target) and a
standalone server on loopback, prints what to try, and stops cleanly on
Ctrl+C or SIGTERM. Quiet by default: no access log.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import secrets
import signal
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import asyncssh
import yaml

from subres.demo import claim as claims
from subres.demo.sshd import SshShellServer
from subres.demo.vnc import VncServer
from subres.demo.website import Website
from subres.server.options import Options, add_operator_arguments
from subres.server.run import Server, complete
from subres.serving import certs

__all__ = ["Demo", "add_arguments", "main", "prepare"]

ADDRESS = "127.0.0.1"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `demo` flags."""
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local/state"))
        / "subres-demo",
        help="where the kubeconfig, certificates and machines file go",
    )
    parser.add_argument("--port", type=int, default=8443, help="HTTPS port on 127.0.0.1 (0: any)")
    add_operator_arguments(parser)


def prepare(
    state_dir: Path,
    port: int,
    *,
    web_port: int,
    console: SshShellServer,
    access_log: bool = False,
) -> Options:
    """Write the state directory's files; the server options that use them.

    `web_port` is where the demo machine's web page listens (its port-forward target);
    `console` is its SSH console server, started (its port and key go into the files).
    """
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    state_dir = state_dir.resolve()
    cert_dir = state_dir / "certs"
    certs.ensure_self_signed(cert_dir, service="subres", namespace="subres-system")
    tokens = state_dir / "tokens.csv"
    if not tokens.exists():
        tokens.write_text(f'{secrets.token_urlsafe(32)},demo,demo-uid,"demo-users"\n')
        tokens.chmod(0o600)
    _write_yaml(state_dir / "config.yaml", _config(state_dir))
    machines = state_dir / "machines.yaml"
    machines.touch(mode=0o600)  # it holds the console's SSH key
    machines.write_text(_machines(state_dir, web_port, console))
    return Options(
        secure_port=port,
        bind_address=ADDRESS,
        cert_dir=cert_dir,
        tls_cert_file=None,
        tls_private_key_file=None,
        client_ca_file=None,
        config=state_dir / "config.yaml",
        standalone=state_dir / "machines.yaml",
        token_auth_file=tokens,
        service_name="subres",
        service_namespace="subres-system",
        # The browser page is static and public; its WebSockets carry the token.
        authorization_always_allow_paths=("/healthz", "/readyz", "/livez", "/ui", "/ui/*"),
        shutdown_grace=2.0,
        access_log=access_log,
        # Audit lines would flood the demo's terminal: they go beside its other files.
        session_audit_log=str(state_dir / "sessions.jsonl"),
    )


def _config(state_dir: Path) -> dict[str, object]:
    running = {".status.phase": ["Running"]}
    vnc = {"endpoint": ".status.vnc.endpoint", "require": running}
    console = {
        "endpoint": ".status.console.endpoint",
        "require": running,
        "ssh": {"credentials": ".status.console.sshSecret"},
    }
    forward = {
        "address": ".status.portForward.address",
        "ports": ".status.portForward.ports",
        "require": running,
    }
    machines = {
        "resource": "machines",
        "kind": "Machine",
        "source": {"group": "subres.dev", "version": "v1alpha1"},
        "subresources": {"console": console, "vnc": vnc, "screenshot": vnc, "portforward": forward},
    }
    return {
        "endpointPolicy": {
            "schemes": ["unix", "tcp", "ssh"],
            # Loopback only: the default policy denies it, the demo's machines live there.
            "allowCIDRs": ["127.0.0.0/8", "::1/128"],
            "denyCIDRs": [],
            "socketDirs": [str(state_dir)],
        },
        "parents": [machines],
    }


def _machines(state_dir: Path, web_port: int, console: SshShellServer) -> str:
    def machine(name: str, phase: str) -> dict[str, object]:
        return {
            "apiVersion": "subres.dev/v1alpha1",
            "kind": "Machine",
            "metadata": {"name": name, "namespace": "default"},
            "status": {
                "phase": phase,
                "console": {
                    "endpoint": f"ssh://demo@{ADDRESS}:{console.port}",
                    "sshSecret": "demo-console",
                },
                "vnc": {"endpoint": f"unix://{state_dir / 'vnc.sock'}"},
                "portForward": {"address": ADDRESS, "ports": [web_port]},
            },
        }

    key = bytes(console.client_private.export_private_key("openssh")).decode()
    login = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "demo-console", "namespace": "default"},
        "stringData": {"ssh-privatekey": key, "known_hosts": console.known_hosts()},
    }
    header = "# Machines the demo serves; edit me, subres re-reads this file.\n"
    return header + yaml.safe_dump_all(
        [machine("demo", "Running"), machine("stopped", "Stopped"), login], sort_keys=False
    )


def _write_yaml(path: Path, data: object) -> None:
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def write_kubeconfig(state_dir: Path, port: int) -> Path:
    """A kubeconfig with the server's address, its CA and the demo token."""
    ca = (state_dir / "certs" / "ca.crt").read_bytes()
    token = _token(state_dir)
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "subres-demo",
                "cluster": {
                    "server": f"https://{ADDRESS}:{port}",
                    "certificate-authority-data": base64.b64encode(ca).decode(),
                },
            }
        ],
        "users": [{"name": "demo", "user": {"token": token}}],
        "contexts": [
            {
                "name": "subres-demo",
                "context": {"cluster": "subres-demo", "user": "demo", "namespace": "default"},
            }
        ],
        "current-context": "subres-demo",
    }
    path = state_dir / "kubeconfig"
    path.touch(mode=0o600)
    _write_yaml(path, kubeconfig)
    return path


@dataclass
class Demo:
    """The running parts: the machine's console, display and web page, and the server."""

    shell: SshShellServer
    display: VncServer
    website: Website
    server: Server | None = None
    kubeconfig: Path | None = None

    @classmethod
    async def start(cls, state_dir: Path, port: int, *, access_log: bool = False) -> Demo:
        """Write `state_dir` (absolute) and start everything; stops what started on failure."""
        demo = cls(
            SshShellServer(
                shell=os.environ.get("SHELL", "/bin/sh"),
                host_key=asyncssh.generate_private_key("ssh-ed25519"),
                client_key=asyncssh.generate_private_key("ssh-ed25519"),
                inputrc=state_dir / "inputrc",
            ),
            VncServer(state_dir / "vnc.sock"),
            Website(),
        )
        try:
            web_port = await demo.website.start()
            await demo.shell.start()
            options = prepare(
                state_dir, port, web_port=web_port, console=demo.shell, access_log=access_log
            )
            await demo.display.start()
            demo.server = complete(options)
            bound = await demo.server.start()
            demo.kubeconfig = write_kubeconfig(state_dir, bound)
        except BaseException:
            await demo.stop()
            raise
        return demo

    async def stop(self) -> None:
        """Stop the server first (it closes the sessions), then the machine's parts."""
        if self.server is not None:
            await self.server.stop()
        await self.display.stop()
        await self.shell.stop()
        await self.website.stop()


def _token(state_dir: Path) -> str:
    return (state_dir / "tokens.csv").read_text().split(",", 1)[0]


def _banner(demo: Demo) -> str:
    assert demo.server is not None and demo.kubeconfig is not None
    port, k = demo.server.port, demo.kubeconfig
    group = "/apis/subresources.subres.dev/v1alpha1"
    # The token rides in the fragment, which browsers never send to the server.
    page = f"https://{ADDRESS}:{port}/ui/?machine=default/demo#token={_token(k.parent)}"
    web = demo.website.port
    return f"""subres demo is serving on https://{ADDRESS}:{port} (Ctrl+C stops it)
  kubeconfig: {k}
  machines:   {k.parent / "machines.yaml"} (edit it; changes apply at once)
  browser:    {page}

Try:
  subres --kubeconfig {k} console demo        (Ctrl+] leaves)
  echo 'uname -a' | subres --kubeconfig {k} console demo
  subres --kubeconfig {k} port-forward demo 8080:{web}   (then open http://localhost:8080/)
  subres --kubeconfig {k} web demo        (console and display at http://127.0.0.1:8070/ui/)
  subres --kubeconfig {k} vnc demo
  subres --kubeconfig {k} screenshot demo -o demo.png
  kubectl --kubeconfig {k} get --raw {group}
  kubectl --kubeconfig {k} get --raw \\
      {group}/namespaces/default/machines/stopped/console
"""


async def _run(state_dir: Path, port: int, claim: claims.Claim, *, access_log: bool) -> None:
    demo = await Demo.start(state_dir, port, access_log=access_log)
    assert demo.server is not None and demo.kubeconfig is not None
    claim.announce(url=f"https://{ADDRESS}:{demo.server.port}", kubeconfig=demo.kubeconfig)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(_banner(demo), flush=True)
    try:
        await stop.wait()
    finally:
        print("stopping", file=sys.stderr, flush=True)
        await demo.stop()


def _port_free(port: int) -> None:
    """Refuse a busy port before writing anything (the server binds it only later)."""
    if port == 0:
        return
    with socket.socket() as probe:
        # As the server's listener will: a port in TIME_WAIT is free to it.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((ADDRESS, port))
        except OSError as exc:
            raise claims.DemoRunning(
                f"port {port} on {ADDRESS} is in use ({exc.strerror}); "
                "is another demo running? pass --port (0 picks a free one)"
            ) from None


def main(ns: argparse.Namespace) -> int:
    """Run the demo until interrupted."""
    try:
        with claims.claim(ns.state_dir) as claim:
            _port_free(ns.port)
            state_dir = ns.state_dir.resolve()
            asyncio.run(_run(state_dir, ns.port, claim, access_log=ns.access_log))
    except claims.DemoRunning as exc:
        print(f"subres demo: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"subres demo: {exc}", file=sys.stderr)
        return 1
    return 0
