"""The install's priority level and FlowSchema, on the real kube-apiserver.

kube-apiserver accepts deploy/base/flowcontrol.yaml, and classifies an
ordinary user's console request into the `subres-streams` level (its answer
names the level in `X-Kubernetes-PF-PriorityLevel-UID`, whatever the answer
itself: APF classifies before authorization and routing), while a
screenshot stays in the default level. The seats the documentation promises
follow from the built-in levels' shares.
"""

from __future__ import annotations

import math
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import yaml

from tests.e2e.controlplane import ControlPlane, poll

FLOWCONTROL = Path(__file__).resolve().parents[2] / "deploy" / "base" / "flowcontrol.yaml"
LEVEL = "subres-streams"
SERVER_LIMIT = 400 + 200
"""kube-apiserver's default --max-requests-inflight plus --max-mutating-requests-inflight."""
MACHINE = "/apis/subresources.subres.dev/v1alpha1/namespaces/default/machines/vm"


@pytest.fixture
async def applied(control_plane: ControlPlane) -> AsyncIterator[dict[str, str]]:
    """The install's flowcontrol objects, applied; their uids by kind. Deleted afterwards."""
    (await control_plane.kubectl("apply", "-f", str(FLOWCONTROL))).check()
    try:
        uids = {}
        for doc in yaml.safe_load_all(FLOWCONTROL.read_text()):
            got = await control_plane.kubectl("get", doc["kind"], LEVEL, "-o", "yaml")
            uids[doc["kind"]] = yaml.safe_load(got.check().stdout)["metadata"]["uid"]
        yield uids
    finally:
        (await control_plane.kubectl("delete", "-f", str(FLOWCONTROL))).check()


async def _level_of(plane: ControlPlane, path: str) -> str:
    """The uid of the priority level kube-apiserver put alice's GET of `path` in."""
    headers = {"Authorization": f"Bearer {plane.users['alice'].token}"}
    context = ssl.create_default_context(cafile=str(plane.server_ca))
    async with (
        aiohttp.ClientSession() as http,
        http.get(plane.url + path, headers=headers, ssl=context) as answer,
    ):
        return answer.headers.get("X-Kubernetes-PF-PriorityLevel-UID", "")


async def test_consoles_get_their_own_level_and_screenshots_stay_where_they_were(
    control_plane: ControlPlane, applied: dict[str, str]
) -> None:
    ours = applied["PriorityLevelConfiguration"]

    async def classified() -> bool:
        return await _level_of(control_plane, f"{MACHINE}/console") == ours

    # The APF configuration controller picks new objects up a moment after they are written.
    assert await poll(classified, timeout_s=30.0), control_plane.logs()
    for sub in ("vnc", "console-observe", "usbredir"):
        assert await _level_of(control_plane, f"{MACHINE}/{sub}") == ours, sub
    assert await _level_of(control_plane, f"{MACHINE}/screenshot") not in ("", ours)

    schema = await control_plane.kubectl("get", "flowschema", LEVEL, "-o", "yaml")
    conditions = yaml.safe_load(schema.check().stdout)["status"]["conditions"]
    assert {"type": "Dangling", "status": "False"}.items() <= next(
        c for c in conditions if c["type"] == "Dangling"
    ).items()


async def test_the_level_has_the_seats_the_documentation_says(
    control_plane: ControlPlane, applied: dict[str, str]
) -> None:
    listed = await control_plane.kubectl("get", "prioritylevelconfigurations", "-o", "yaml")
    levels = yaml.safe_load(listed.check().stdout)["items"]
    shares = {
        level["metadata"]["name"]: level["spec"]["limited"]["nominalConcurrencyShares"]
        for level in levels
        if level["spec"]["type"] == "Limited"
    }
    builtin = sum(v for k, v in shares.items() if k != LEVEL)
    total = builtin + shares[LEVEL]
    print(f"  built-in shares {builtin}; {LEVEL} {shares[LEVEL]}")
    assert builtin == 245
    assert math.ceil(SERVER_LIMIT * shares[LEVEL] / total) == 174
    assert math.ceil(SERVER_LIMIT * shares["global-default"] / total) == 35
