"""`DELETE …/{resource}/{name}/console-moderate` (or `vnc-moderate`): a moderator ends the session.

Authorized as `delete` on that subresource, then checked against the
moderation policies (the user must be one of the console's or display's
moderators). The moderated session lives with the unit's owner: here, or
asked over the peer port (`DELETE /peer/v1/moderated/…`). It ends with
close code 4006 and "ended by the moderator NAME", which its client, its
audit line, its Event and its recording all say. The answer is a `Status`:
200 naming how many sessions ended, 404 when none was moderated.
"""

from __future__ import annotations

import json
from urllib.parse import urlencode

from aiohttp import web

from subres.auth import user
from subres.kube.status import StatusError
from subres.server import subresource
from subres.server.middleware import who
from subres.server.state import State
from subres.sessions import peer, sharing
from subres.sessions.runtime import Who
from subres.sessions.target import Target, key

__all__ = ["end", "end_here"]

MAX_ANSWER = 1 << 16


async def end(state: State, request: web.Request) -> web.Response:
    """End the moderated session of the console or display the path names."""
    sub = request.path.rsplit("/", 1)[1].removesuffix("-moderate")
    target = subresource.resolve(state, request, sub)
    moderator = who(request)
    sharing.may_moderate(state, target, moderator)
    unit = key(target)
    owner = state.owners.owner(unit)
    if owner is None or owner == state.replica:
        ended = _end(state, target, moderator)
    else:
        ended = await _end_there(state, target, owner, moderator)
    what = f"{target.spec.name} session of {target.describe()}"
    if not ended:
        raise StatusError(404, f"no moderated {what} is live")
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "message": f"{moderator.user} ended the moderated {what}",
        "code": 200,
    }
    return web.json_response(body)


async def end_here(state: State, request: web.Request) -> web.Response:
    """The owner's side (the peer port's `DELETE /peer/v1/moderated/…`)."""
    info = request.match_info
    parent = state.config.parent(info["resource"])
    spec = parent.subresources.get(info["subresource"]) if parent is not None else None
    if parent is None or spec is None:
        raise StatusError(404, f"no {info['subresource']} of {info['resource']} here")
    target = subresource.checked(state, parent, spec, info["namespace"], info["name"])
    moderator = Who(identity=peer.identity(request.query.get("user", "")), client="", request_id="")
    sharing.may_moderate(state, target, moderator)
    return web.json_response({"ended": _end(state, target, moderator)})


def _end(state: State, target: Target, moderator: Who) -> int:
    gate = state.sessions.gates.get(key(target))
    return gate.end(moderator.user) if gate is not None else 0


async def _end_there(state: State, target: Target, owner: str, moderator: Who) -> int:
    address = state.owners.addresses.get(owner)
    if address is None:
        raise StatusError(503, f"the replica {owner} owning {target.describe()} has no address")
    query = urlencode([("user", user.encode(moderator.identity))])
    path = (
        f"/peer/v1/moderated/{target.parent.resource}/{target.spec.name}/"
        f"{target.namespace}/{target.name}?{query}"
    )
    try:
        status, body = await state.peers.call("DELETE", address, path, limit=MAX_ANSWER)
    except OSError as exc:
        raise StatusError(503, f"cannot reach the replica {owner}: {exc}") from None
    if status != 200:
        raise StatusError(503, f"the replica {owner} answered {status}")
    try:
        ended = json.loads(body)["ended"]
    except (ValueError, KeyError, TypeError):
        raise StatusError(503, f"the replica {owner} answered nonsense") from None
    return int(ended)
