"""examples/metal3/config.yaml served standalone: BareMetalHosts' consoles through ipmi_sim.

The profile is loaded as shipped; only its endpoint policy is widened to
loopback, where the test's BMC listens.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.ipmi_support import PASSWORD, USERNAME, Bmc, bmc, needs_ipmi_sim
from tests.ssh_support import secret
from tests.support import Standalone, start_standalone

pytestmark = needs_ipmi_sim

PROFILE = Path(__file__).resolve().parents[2] / "examples" / "metal3" / "config.yaml"


def host(name: str, address: str, credentials: str = "bmc-secret") -> dict[str, Any]:
    return {
        "apiVersion": "metal3.io/v1alpha1",
        "kind": "BareMetalHost",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {"online": True, "bmc": {"address": address, "credentialsName": credentials}},
    }


@pytest.fixture
async def metal3(tmp_path: Path) -> AsyncIterator[tuple[Standalone, Bmc]]:
    profile = yaml.safe_load(PROFILE.read_text())
    profile["endpointPolicy"] |= {"allowCIDRs": ["127.0.0.0/8"], "denyCIDRs": []}
    async with bmc(tmp_path) as sim:
        objects = [
            secret("bmc-secret", {"username": USERNAME, "password": PASSWORD}),
            host("worker-0", sim.url),
            host("redfish", "redfish+https://127.0.0.1/redfish/v1/Systems/1"),
            host("bare", f"127.0.0.1:{sim.port}"),
        ]
        async with start_standalone(tmp_path, *objects, config=profile) as subres:
            yield subres, sim


def url(subres: Standalone, name: str) -> str:
    return subres.api_url(f"baremetalhosts/{name}/console")


async def test_a_hosts_console_is_its_bmcs_serial_over_lan(
    metal3: tuple[Standalone, Bmc],
) -> None:
    subres, sim = metal3
    async with subres.websocket(url(subres, "worker-0"), "plain.kubevirt.io") as conn:
        for _ in range(5):  # ipmi_sim may drop a new session's first packet
            await conn.send(b"\r")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2):
                    await sim.serial.until_match(b"\r")
                break
        await sim.serial.write(b"worker-0 login: ")
        got = b""
        async with asyncio.timeout(20):
            while b"login: " not in got:
                message = await conn.recv()
                assert isinstance(message, bytes)
                got += message


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("redfish", "unsupported endpoint scheme 'redfish+https'"),
        ("bare", "it names none"),
    ],
)
async def test_other_address_types_are_refused_by_name(
    metal3: tuple[Standalone, Bmc], name: str, words: str
) -> None:
    subres, _ = metal3
    code, status = await subres.refused(url(subres, name), "plain.kubevirt.io")
    assert code == 400 and words in str(status["message"]), status
