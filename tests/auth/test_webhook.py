"""TokenReview and SubjectAccessReview against a fake apiserver: caching, coalescing, errors."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from subres.auth import attributes
from subres.auth.authn import Unauthenticated
from subres.auth.user import UserInfo
from subres.auth.webhook import (
    AuthorizerSettings,
    TokenReviewAuthenticator,
    TokenReviewSettings,
    WebhookAuthorizer,
)
from subres.kube import client
from subres.kube.status import StatusError
from tests.fakeapi import FakeApiServer, start_fake

ALICE = {"username": "alice", "uid": "u-1", "groups": ["devs"], "extra": {"scopes": ["a"]}}
CONSOLE = attributes.from_request(
    "GET", "/apis/subresources.subres.dev/v1alpha1/namespaces/ns/machines/vm/console"
)


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@contextlib.asynccontextmanager
async def api(tmp_path: Path) -> AsyncIterator[tuple[FakeApiServer, client.Api]]:
    async with start_fake(tmp_path) as fake:
        fake.tokens["good"] = ALICE
        kube = await client.connect(fake.kubeconfig())
        try:
            yield fake, kube
        finally:
            await kube.close()


async def test_identical_concurrent_tokens_cost_one_review(tmp_path: Path) -> None:
    async with api(tmp_path) as (fake, kube):
        fake.token_gate = asyncio.Event()
        authn = TokenReviewAuthenticator(kube, TokenReviewSettings())
        lookups = [asyncio.create_task(authn.authenticate("good")) for _ in range(20)]
        await fake.wait(lambda: fake.calls["tokenreview"] == 1)
        fake.token_gate.set()
        users = await asyncio.gather(*lookups)
        assert {u.name for u in users} == {"alice"}
        assert users[0] == UserInfo("alice", "u-1", ("devs",), {"scopes": ("a",)})
        assert fake.calls["tokenreview"] == 1


async def test_success_and_failure_cached_for_ttl(tmp_path: Path) -> None:
    async with api(tmp_path) as (fake, kube):
        clock = Clock()
        authn = TokenReviewAuthenticator(kube, TokenReviewSettings(), clock=clock)
        await authn.authenticate("good")
        await authn.authenticate("good")
        assert fake.calls["tokenreview"] == 1
        for _ in range(2):
            with pytest.raises(Unauthenticated, match="invalid bearer token"):
                await authn.authenticate("bad")
        assert fake.calls["tokenreview"] == 2
        clock.now += 10.5
        await authn.authenticate("good")
        with pytest.raises(Unauthenticated):
            await authn.authenticate("bad")
        assert fake.calls["tokenreview"] == 4


async def test_review_errors_are_not_cached(tmp_path: Path) -> None:
    async with api(tmp_path) as (fake, kube):
        authn = TokenReviewAuthenticator(kube, TokenReviewSettings())
        fake.token_error = True
        with pytest.raises(Unauthenticated, match="token review failed"):
            await authn.authenticate("good")
        fake.token_error = False
        assert (await authn.authenticate("good")).name == "alice"
        assert fake.calls["tokenreview"] == 2


async def test_sar_allowed_and_denied_cached_separately(tmp_path: Path) -> None:
    async with api(tmp_path) as (fake, kube):
        clock = Clock()
        fake.allow = lambda spec: spec["user"] == "alice"
        settings = AuthorizerSettings(allowed_ttl=10, denied_ttl=2)
        authz = WebhookAuthorizer(kube, settings, clock=clock)
        alice, bob = UserInfo("alice", groups=("devs",)), UserInfo("bob")
        assert (await authz.authorize(alice, CONSOLE)).allowed
        assert not (await authz.authorize(bob, CONSOLE)).allowed
        assert (await authz.authorize(alice, CONSOLE)).allowed
        assert not (await authz.authorize(bob, CONSOLE)).allowed
        assert fake.calls["sar"] == 2
        assert fake.sar_specs[0] == {
            "user": "alice",
            "groups": ["devs"],
            "extra": {},
            "resourceAttributes": {
                "namespace": "ns",
                "verb": "get",
                "group": "subresources.subres.dev",
                "version": "v1alpha1",
                "resource": "machines",
                "subresource": "console",
                "name": "vm",
            },
        }
        clock.now += 3  # the denial expired, the allowance did not
        await authz.authorize(alice, CONSOLE)
        await authz.authorize(bob, CONSOLE)
        assert fake.calls["sar"] == 3


async def test_sar_error_is_500_and_not_cached(tmp_path: Path) -> None:
    async with api(tmp_path) as (fake, kube):
        fake.allow = lambda spec: True
        authz = WebhookAuthorizer(kube, AuthorizerSettings())
        fake.sar_error = True
        with pytest.raises(StatusError) as raised:
            await authz.authorize(UserInfo("alice"), CONSOLE)
        assert raised.value.code == 500
        fake.sar_error = False
        assert (await authz.authorize(UserInfo("alice"), CONSOLE)).allowed
        assert fake.calls["sar"] == 2


async def test_masters_and_health_paths_skip_the_review(tmp_path: Path) -> None:
    async with api(tmp_path) as (fake, kube):
        authz = WebhookAuthorizer(kube, AuthorizerSettings())
        admin = UserInfo("root", groups=("system:masters",))
        assert (await authz.authorize(admin, CONSOLE)).allowed
        health = attributes.from_request("GET", "/readyz")
        assert (await authz.authorize(UserInfo("system:anonymous"), health)).allowed
        other = attributes.from_request("GET", "/metrics")
        assert not (await authz.authorize(UserInfo("system:anonymous"), other)).allowed
        assert fake.sar_specs == [
            {
                "user": "system:anonymous",
                "groups": [],
                "extra": {},
                "nonResourceAttributes": {"path": "/metrics", "verb": "get"},
            }
        ]
