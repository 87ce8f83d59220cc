"""The install's FlowSchema, on the real kube-apiserver.

kube-apiserver accepts deploy/base/flowcontrol.yaml, and classifies an
ordinary user's console, display, observer and USB requests into the built-in
`exempt` level, which holds no seats (its answer names the level in
`X-Kubernetes-PF-PriorityLevel-UID`, whatever the answer itself: APF
classifies before authorization and routing), while a screenshot, a short
request, stays in the default levels.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import yaml

from tests.e2e.controlplane import ControlPlane, poll

FLOWCONTROL = Path(__file__).resolve().parents[2] / "deploy" / "base" / "flowcontrol.yaml"
SCHEMA = "subres-streams"
MACHINE = "/apis/subresources.subres.dev/v1alpha1/namespaces/default/machines/vm"


@pytest.fixture
async def exempt(control_plane: ControlPlane) -> AsyncIterator[str]:
    """The install's FlowSchema, applied (deleted afterwards); the `exempt` level's uid."""
    (await control_plane.kubectl("apply", "-f", str(FLOWCONTROL))).check()
    try:
        got = await control_plane.kubectl(
            "get", "prioritylevelconfiguration", "exempt", "-o", "yaml"
        )
        yield yaml.safe_load(got.check().stdout)["metadata"]["uid"]
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


async def test_streams_hold_no_seat_and_screenshots_stay_where_they_were(
    control_plane: ControlPlane, exempt: str
) -> None:
    async def classified() -> bool:
        return await _level_of(control_plane, f"{MACHINE}/console") == exempt

    # The APF configuration controller picks new objects up a moment after they are written.
    assert await poll(classified, timeout_s=30.0), control_plane.logs()
    for sub in ("vnc", "console-observe", "console-moderate", "usbredir"):
        assert await _level_of(control_plane, f"{MACHINE}/{sub}") == exempt, sub
    assert await _level_of(control_plane, f"{MACHINE}/screenshot") not in ("", exempt)

    schema = await control_plane.kubectl("get", "flowschema", SCHEMA, "-o", "yaml")
    conditions = yaml.safe_load(schema.check().stdout)["status"]["conditions"]
    assert {"type": "Dangling", "status": "False"}.items() <= next(
        c for c in conditions if c["type"] == "Dangling"
    ).items()
