"""`…/{resource}/{name}/usbredir`: a USB device of the client's, redirected to the machine.

The usbredir protocol is relayed as it is, never parsed, in raw binary
WebSocket messages (as KubeVirt's `virtctl usbredir` sends it), to one of the
machine's USB redirection slots (`sessions.usbslots`): a socket such as
QEMU's `-chardev socket,…` with `-device usb-redir` on it.

Each slot takes one client at a time. A new client gets the first free slot;
when every slot is held it takes over the one held longest, whose client is
closed with 4001 naming who took it, unless it asked
`?preserveSession=true`: then 409. One replica owns a machine's USB
redirection and chooses the slots (`sessions.members`); when that is another
replica, this one relays to it (`sessions.peer`), which says in its answer
which slot it gave. Audit lines, Events and the sessions list show each
session with its slot (`mode: redirector`).
"""

from __future__ import annotations

import dataclasses

from aiohttp import web

from subres.engine.stream import ByteStream
from subres.server import handshake, streaming, subresource
from subres.server.middleware import who
from subres.server.state import State
from subres.sessions import peer, usbslots
from subres.sessions.modes import Mode
from subres.sessions.target import Target

__all__ = ["SUBPROTOCOLS", "handle"]

SUBPROTOCOLS = ("", "plain.kubevirt.io", "binary")
"""Raw binary: no subprotocol, KubeVirt's, or a browser relay's `binary`."""


async def handle(state: State, request: web.Request) -> web.StreamResponse:
    """Check, negotiate, pick a slot (here or on the owner), dial it, then upgrade and relay."""
    target = subresource.resolve(state, request, "usbredir")
    choices = usbslots.slots(target)
    if handshake.dry_run(request):  # every check, and the policy on every slot; no dial
        for slot, url in choices:
            await subresource.vet(state, slot, url)
        return handshake.dry_run_passed()
    ws, dialect = streaming.negotiate(state, request, "usbredir", SUBPROTOCOLS)
    # Spelled as KubeVirt parses it (Go's strconv.ParseBool).
    preserve = request.query.get("preserveSession", "").lower() in ("1", "t", "true")
    mode = Mode.REDIRECTOR
    relayed = await peer.front(state, target, who(request), mode=mode, preserve=preserve, tail=None)
    backend: ByteStream
    if relayed is not None:
        slot, backend = _given(target, relayed.unit), relayed
    else:
        slot, url = usbslots.choose(state.sessions, target, choices, preserve=preserve)
        backend = await subresource.connect(state, slot, url)
    return await streaming.serve(
        state,
        request,
        target=slot,
        ws=ws,
        dialect=dialect,
        backend=backend,
        exclusive=relayed is None,
        preserve=preserve,
        mode=mode,
    )


def _given(target: Target, unit: str) -> Target:
    """`target` as the slot its owner gave (the session's record names it)."""
    return dataclasses.replace(target, spec=dataclasses.replace(target.spec, unit=unit))
