"""`subres demo`: the whole product on one machine, no cluster needed.

Claims the state directory (a second demo there refuses before it touches
anything: `subres.demo.claim`), writes it (`subres.demo.files`), starts the
demo machine's console (a shell in a PTY behind an SSH server on loopback,
so that window sizes reach it), its display (a small VNC server on a unix
socket), its web page (the port-forward target), a standalone server on
loopback, and the browser page behind `subres web`'s relay on plain HTTP on
loopback (its link carries a key made for this run, so no certificate
warning and no other local user's process can drive it), prints what to try
(`subres.demo.banner`), and stops cleanly on Ctrl+C or SIGTERM, removing the
keys and tokens it wrote and keeping the user's machines file. Quiet by
default: no access log, and other libraries' INFO lines only with `-v`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path

import asyncssh
from aiohttp import web as aioweb

from subres.cli import invocation, web
from subres.cli import kubeconfig as kubeconfigs
from subres.demo import banner, files
from subres.demo import claim as claims
from subres.demo.sshd import SshShellServer
from subres.demo.vnc import VncServer
from subres.demo.website import Website
from subres.server.options import Options, add_operator_arguments
from subres.server.run import Server, complete
from subres.web import page

__all__ = ["Demo", "add_arguments", "main", "prepare"]

ADDRESS = files.ADDRESS
MACHINE = "default/demo"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `demo` flags."""
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local/state"))
        / "subres-demo",
        help="where the kubeconfig, certificates and machines file go (removed at stop; "
        "the machines file without its key, recordings and the session audit log stay)",
    )
    parser.add_argument("--port", type=int, default=8443, help="HTTPS port on 127.0.0.1 (0: any)")
    parser.add_argument(
        "--page-port", type=int, default=0, help="the browser page's port on 127.0.0.1 (0: any)"
    )
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
    files.serving_pair(state_dir)
    return Options(
        secure_port=port,
        bind_address=files.ADDRESS,
        cert_dir=state_dir / files.CERTS,
        tls_cert_file=None,
        tls_private_key_file=None,
        client_ca_file=None,
        config=files.config(state_dir),
        standalone=files.machines(state_dir, web_port=web_port, console=console),
        token_auth_file=files.tokens(state_dir),
        service_name="subres",
        service_namespace="subres-system",
        # The browser page is static and public; its WebSockets carry the token.
        authorization_always_allow_paths=("/healthz", "/readyz", "/livez", "/ui", "/ui/*"),
        shutdown_grace=2.0,
        access_log=access_log,
        # Audit lines would flood the demo's terminal: they go beside its other files.
        session_audit_log=str(state_dir / files.AUDIT),
    )


@dataclass
class Demo:
    """The running parts: the machine's console, display and web page, the server, the page."""

    shell: SshShellServer
    display: VncServer
    website: Website
    server: Server | None = None
    kubeconfig: Path | None = None
    page: aioweb.AppRunner | None = None
    page_url: str = ""
    key: str = field(default_factory=web.new_key)
    """The page relay's key for this run."""

    @classmethod
    async def start(
        cls, state_dir: Path, port: int, *, page_port: int = 0, access_log: bool = False
    ) -> Demo:
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
            demo.kubeconfig = files.kubeconfig(state_dir, bound)
            await demo._start_page(page_port)
        except BaseException:
            await demo.stop()
            raise
        return demo

    async def _start_page(self, port: int) -> None:
        """The page behind `subres web`'s relay, which adds the demo's token upstream."""
        assert self.kubeconfig is not None
        config = kubeconfigs.load(kubeconfig=str(self.kubeconfig), environ={})
        settings = page.PageSettings(
            api_prefix="/apis/subresources.subres.dev/v1alpha1", machine=MACHINE
        )
        self.page = await web.serve(web.build(config, settings, key=self.key), ADDRESS, port)
        self.page_url = web.page_url(ADDRESS, self.page.addresses[0][1], settings, self.key)

    async def stop(self) -> None:
        """Stop the page and the server first (they close the sessions), then the machine."""
        if self.page is not None:
            await self.page.cleanup()
        if self.server is not None:
            await self.server.stop()
        await self.display.stop()
        await self.shell.stop()
        await self.website.stop()


def _banner(demo: Demo) -> str:
    assert demo.server is not None and demo.kubeconfig is not None
    return banner.text(
        banner.Banner(
            url=f"https://{ADDRESS}:{demo.server.port}",
            page=demo.page_url,
            kubeconfig=demo.kubeconfig,
            machines=demo.kubeconfig.parent / files.MACHINES,
            web_port=demo.website.port,
            subres=invocation.command(),
        )
    )


async def _run(
    state_dir: Path, port: int, claim: claims.Claim, *, page_port: int, access_log: bool
) -> None:
    try:
        demo = await Demo.start(state_dir, port, page_port=page_port, access_log=access_log)
    except BaseException:
        files.remove(state_dir)
        raise
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
        files.remove(state_dir)
        print(_stopped(state_dir), file=sys.stderr, flush=True)


def _stopped(state_dir: Path) -> str:
    """What stopping removed, and what it kept for the user."""
    kept = [
        name + ("/" if (state_dir / name).is_dir() else "")
        for name in files.KEPT
        if (state_dir / name).exists()
    ]
    said = f"stopped: removed the keys, token and kubeconfig from {state_dir}"
    if files.MACHINES in kept:
        said += f"; kept {files.MACHINES} (your machines, without the console's key)"
        kept.remove(files.MACHINES)
    if kept:
        said += f"; kept {' and '.join(kept)} (yours to replay and read)"
    return said


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
            state_dir = ns.state_dir.resolve()
            try:
                _port_free(ns.port)
                asyncio.run(
                    _run(
                        state_dir,
                        ns.port,
                        claim,
                        page_port=ns.page_port,
                        access_log=ns.access_log,
                    )
                )
            finally:
                # Ours to remove while we hold the claim, however the demo ended.
                files.remove(state_dir)
    except (claims.DemoRunning, files.MachinesError) as exc:
        print(f"subres demo: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"subres demo: {exc}", file=sys.stderr)
        return 1
    return 0
