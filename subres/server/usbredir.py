"""`…/{resource}/{name}/usbredir`: a USB device of the client's, redirected to the machine.

The usbredir protocol is relayed as it is, never parsed, in raw binary
WebSocket messages (as KubeVirt's `virtctl usbredir` sends it), to one of the
machine's USB redirection slots: a socket such as QEMU's `-chardev socket,…`
with `-device usb-redir` on it. The parent kind's `slots` caps how many a
machine has (KubeVirt's `UsbClientPassthroughMaxNumberOf`, 4 by default); its
endpoint names one URL per slot: a list, or a template with `{slot}`.

Each slot takes one client at a time. A new client gets the first free slot;
when every slot is held it takes over the one held longest, whose client is
closed with 4001 naming who took it, unless it asked
`?preserveSession=true`: then 409. Audit lines, Events and the sessions list
show each session with its slot (`mode: redirector`).
"""

from __future__ import annotations

import dataclasses
import math

from aiohttp import web

from subres import fields
from subres.config import SLOT, slot_source
from subres.kube.status import StatusError
from subres.server import handshake, session, streaming, subresource
from subres.server.state import State
from subres.server.subresource import Target

__all__ = ["SUBPROTOCOLS", "handle", "slots"]

SUBPROTOCOLS = ("", "plain.kubevirt.io", "binary")
"""Raw binary: no subprotocol, KubeVirt's, or a browser relay's `binary`."""


async def handle(state: State, request: web.Request) -> web.StreamResponse:
    """Check, negotiate, pick a slot, dial it, then upgrade and relay."""
    target = subresource.resolve(state, request, "usbredir")
    choices = slots(target)
    if handshake.dry_run(request):  # every check, and the policy on every slot; no dial
        for slot, url in choices:
            await subresource.vet(state, slot, url)
        return handshake.dry_run_passed()
    ws, dialect = streaming.negotiate(state, request, "usbredir", SUBPROTOCOLS)
    preserve = request.query.get("preserveSession", "").lower() in ("1", "t", "true")
    slot, url = _choose(state, target, choices, preserve=preserve)
    backend = await subresource.connect(state, slot, url)
    return await streaming.serve(
        state,
        request,
        target=slot,
        ws=ws,
        dialect=dialect,
        backend=backend,
        exclusive=True,
        preserve=preserve,
        mode=session.REDIRECTOR,
    )


def slots(target: Target) -> list[tuple[Target, str]]:
    """Each USB slot of the parent, as a target of its own, with its URL (400 for none).

    The endpoint is read once per slot when it names `{slot}`; otherwise it
    holds one URL (one slot) or a list of them, of which the first `slots`.
    """
    spec = target.spec
    try:
        if SLOT in spec.endpoint:
            urls = [
                fields.read(slot_source(spec.endpoint, i), target.obj) for i in range(spec.slots)
            ]
        else:
            found = fields.read(spec.endpoint, target.obj)
            urls = found[: spec.slots] if isinstance(found, list) else [found]
    except fields.FieldError as exc:
        raise StatusError(
            400, f"{target.describe()} has no usable usbredir endpoint: {exc}"
        ) from None
    if not urls or urls == [None]:
        raise StatusError(
            400, f"{target.describe()} has no USB redirection ({spec.endpoint} is empty)"
        )
    if not all(isinstance(url, str) and url for url in urls):
        raise StatusError(400, f"{target.describe()}: {spec.endpoint} is not a list of URLs")
    return [
        (dataclasses.replace(target, spec=dataclasses.replace(spec, unit=str(i))), url)
        for i, url in enumerate(urls)
    ]


def _choose(
    state: State, target: Target, choices: list[tuple[Target, str]], *, preserve: bool
) -> tuple[Target, str]:
    """The first free slot; with none, the one held longest (409 when asked to preserve)."""
    for choice in choices:
        if not state.sessions.active(session.key(choice[0])):
            return choice
    if preserve:
        raise StatusError(
            409,
            f"all {len(choices)} USB slots of {target.describe()} are in use; "
            "connect without preserveSession=true to take one over",
        )
    # Slots another replica holds have no age here: they go after this replica's.
    return min(choices, key=lambda c: _age(state, c[0]))


def _age(state: State, slot: Target) -> float:
    since = state.sessions.since(session.key(slot))
    return math.inf if since is None else since
