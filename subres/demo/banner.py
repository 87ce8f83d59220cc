"""What `subres demo` prints once it serves: where things are, and what to try.

Every command under "Try:" runs as printed (a test runs each one) once the
`export KUBECONFIG=…` line above it has run; each says what it does in a
shell comment, so a whole line can be pasted, and the one example that is
meant to fail says so. `subres` is written as this shell can run it
(`subres.cli.invocation`): an install whose virtualenv is not activated is
named by its path.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

__all__ = ["FAILS", "Banner", "text"]

GROUP = "/apis/subresources.subres.dev/v1alpha1"
FAILS = "meant to fail"
"""The words that mark an example whose failure is the point."""


@dataclass(frozen=True)
class Banner:
    """What the banner names."""

    url: str
    """The API server's URL."""
    page: str
    """The browser page's link, its key in the fragment."""
    kubeconfig: Path
    machines: Path
    web_port: int
    """The port the demo machine's web page listens on (the port-forward target)."""
    subres: str = "subres"
    """How the user's shell runs this subres (`subres.cli.invocation.command`)."""


def text(banner: Banner) -> str:
    """The banner, ending with a newline."""
    stopped = f"{GROUP}/namespaces/default/machines/stopped/console"
    subres = banner.subres
    tries = [
        (f"{subres} console demo", "Ctrl+] leaves; the session is recorded"),
        (f"echo 'uname -a' | {subres} console demo", ""),
        (f"{subres} recordings demo", "the sessions above; it says how to play one"),
        (f"{subres} port-forward demo 8080:{banner.web_port}", "then open http://localhost:8080/"),
        (f"{subres} vnc demo", "starts remote-viewer or vncviewer"),
        (f"{subres} screenshot demo -o demo.png", ""),
        (f"{subres} web demo", "the page again, served the way you would for a cluster"),
        (f"kubectl get --raw {GROUP}", ""),
        (f"kubectl get --raw {stopped}", f'{FAILS}: "stopped" is not running (409)'),
    ]
    width = max(len(command) for command, _ in tries[:-1])
    lines = [f"  {c:<{width}}  # {remark}" if remark else f"  {c}" for c, remark in tries]
    return (
        f"subres demo is serving on {banner.url} (Ctrl+C stops it)\n"
        f"  page:     {banner.page}\n"
        f"  machines: {banner.machines} (edit it; changes apply at once and stay)\n"
        "\n"
        "Point subres and kubectl at the demo, once in each terminal:\n"
        f"  export KUBECONFIG={shlex.quote(str(banner.kubeconfig))}\n"
        "\n"
        "Try:\n" + "\n".join(lines) + "\n"
    )
