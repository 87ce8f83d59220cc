"""`subres demo`: the whole product on one machine, no cluster needed.

Writes a state directory (certificates, a random token, a kubeconfig, the
machines file, the config), starts the demo machine's console (a shell in a
PTY on a unix socket), its display (a small VNC server on another) and a
standalone server on loopback, prints what to try, and stops cleanly on
Ctrl+C or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import secrets
import signal
import sys
from pathlib import Path

import yaml

from subres.demo.shell import ShellServer
from subres.demo.vnc import VncServer
from subres.server import certs
from subres.server.options import Options
from subres.server.run import Server, complete

__all__ = ["add_arguments", "main", "prepare", "start"]

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


def prepare(state_dir: Path, port: int) -> Options:
    """Write the state directory's files; the server options that use them."""
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    state_dir = state_dir.resolve()
    cert_dir = state_dir / "certs"
    certs.ensure_self_signed(cert_dir, service="subres", namespace="subres-system")
    tokens = state_dir / "tokens.csv"
    if not tokens.exists():
        tokens.write_text(f'{secrets.token_urlsafe(32)},demo,demo-uid,"demo-users"\n')
        tokens.chmod(0o600)
    _write_yaml(state_dir / "config.yaml", _config(state_dir))
    (state_dir / "machines.yaml").write_text(_machines(state_dir))
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
    )


def _config(state_dir: Path) -> dict[str, object]:
    return {
        "endpointPolicy": {
            "schemes": ["unix", "tcp"],
            "allowCIDRs": ["127.0.0.0/8", "::1/128"],
            "socketDirs": [str(state_dir)],
        }
    }


def _machines(state_dir: Path) -> str:
    def machine(name: str, phase: str) -> dict[str, object]:
        return {
            "apiVersion": "subres.dev/v1alpha1",
            "kind": "Machine",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "console": {"endpoint": f"unix://{state_dir / 'console.sock'}"},
                "vnc": {"endpoint": f"unix://{state_dir / 'vnc.sock'}"},
            },
            "status": {"phase": phase},
        }

    header = "# Machines the demo serves; edit me, subres re-reads this file.\n"
    return header + yaml.safe_dump_all(
        [machine("demo", "Running"), machine("stopped", "Stopped")], sort_keys=False
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


async def start(state_dir: Path, port: int) -> tuple[Server, ShellServer, VncServer, Path]:
    """Start the console shell, the display and the server; the kubeconfig path."""
    options = prepare(state_dir, port)
    assert options.standalone is not None
    shell = ShellServer(
        options.standalone.parent / "console.sock", shell=os.environ.get("SHELL", "/bin/sh")
    )
    display = VncServer(options.standalone.parent / "vnc.sock")
    await shell.start()
    try:
        await display.start()
        server = complete(options)
        bound = await server.start()
    except BaseException:
        await display.stop()
        await shell.stop()
        raise
    return server, shell, display, write_kubeconfig(options.standalone.parent, bound)


def _token(state_dir: Path) -> str:
    return (state_dir / "tokens.csv").read_text().split(",", 1)[0]


def _banner(kubeconfig: Path, port: int) -> str:
    group = "/apis/subresources.subres.dev/v1alpha1"
    # The token rides in the fragment, which browsers never send to the server.
    page = f"https://{ADDRESS}:{port}/ui/?machine=default/demo#token={_token(kubeconfig.parent)}"
    return f"""subres demo is serving on https://{ADDRESS}:{port} (Ctrl+C stops it)
  kubeconfig: {kubeconfig}
  machines:   {kubeconfig.parent / "machines.yaml"} (edit it; changes apply at once)
  browser:    {page}

Try:
  subres --kubeconfig {kubeconfig} console demo        (Ctrl+] leaves)
  echo 'uname -a' | subres --kubeconfig {kubeconfig} console demo
  subres --kubeconfig {kubeconfig} vnc demo
  subres --kubeconfig {kubeconfig} screenshot demo -o demo.png
  kubectl --kubeconfig {kubeconfig} get --raw {group}
  kubectl --kubeconfig {kubeconfig} get --raw \\
      {group}/namespaces/default/machines/stopped/console
"""


async def _run(state_dir: Path, port: int) -> None:
    server, shell, display, kubeconfig = await start(state_dir, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(_banner(kubeconfig, server.port), flush=True)
    try:
        await stop.wait()
    finally:
        print("stopping", file=sys.stderr, flush=True)
        await server.stop()
        await display.stop()
        await shell.stop()


def main(ns: argparse.Namespace) -> int:
    """Run the demo until interrupted."""
    try:
        asyncio.run(_run(ns.state_dir, ns.port))
    except OSError as exc:
        print(f"subres demo: {exc}", file=sys.stderr)
        return 1
    return 0
