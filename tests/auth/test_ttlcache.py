"""The webhooks' answer cache and call coalescing, on a clock the test turns."""

from __future__ import annotations

import asyncio

import pytest

from subres.auth.ttlcache import Coalescer, TTLCache


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_value_lives_exactly_its_ttl() -> None:
    clock = Clock()
    cache: TTLCache[str, str] = TTLCache(max_entries=10, clock=clock)
    cache.put("alice", "allowed", ttl=10)
    clock.now += 9.999
    assert cache.get("alice") == "allowed"
    clock.now += 0.001
    assert cache.get("alice") is None
    assert len(cache) == 0  # an expired entry is dropped when seen


@pytest.mark.parametrize("ttl", [0, -1])
def test_a_ttl_that_is_not_positive_caches_nothing(ttl: float) -> None:
    cache: TTLCache[str, str] = TTLCache(max_entries=10, clock=Clock())
    cache.put("alice", "allowed", ttl=ttl)
    assert cache.get("alice") is None and len(cache) == 0


def test_the_least_recently_used_goes_first_beyond_the_bound() -> None:
    cache: TTLCache[str, int] = TTLCache(max_entries=2, clock=Clock())
    cache.put("a", 1, ttl=10)
    cache.put("b", 2, ttl=10)
    assert cache.get("a") == 1  # a is now the most recently used
    cache.put("c", 3, ttl=10)
    assert (cache.get("a"), cache.get("b"), cache.get("c")) == (1, None, 3)
    assert len(cache) == 2


def test_putting_again_refreshes_the_value_and_its_expiry() -> None:
    clock = Clock()
    cache: TTLCache[str, str] = TTLCache(max_entries=10, clock=clock)
    cache.put("alice", "denied", ttl=10)
    clock.now += 8
    cache.put("alice", "allowed", ttl=10)
    clock.now += 8
    assert cache.get("alice") == "allowed"


async def test_identical_concurrent_calls_share_one() -> None:
    coalescer: Coalescer[str, str] = Coalescer()
    calls = 0
    entered, release = asyncio.Event(), asyncio.Event()

    async def review() -> str:
        nonlocal calls
        calls += 1
        entered.set()
        await release.wait()
        return "allowed"

    waiters = [asyncio.create_task(coalescer.run("alice", review)) for _ in range(5)]
    other = asyncio.create_task(coalescer.run("bob", review))
    # Tasks start in order: once the call runs, every waiter created before has joined.
    await entered.wait()
    release.set()
    async with asyncio.timeout(5):
        assert await asyncio.gather(*waiters, other) == ["allowed"] * 6
    assert calls == 2  # one for alice, one for bob


async def test_a_failure_reaches_every_waiter_and_is_not_kept() -> None:
    coalescer: Coalescer[str, str] = Coalescer()
    attempts = 0
    entered, release = asyncio.Event(), asyncio.Event()

    async def flaky() -> str:
        nonlocal attempts
        attempts += 1
        entered.set()
        await release.wait()
        if attempts == 1:
            raise ConnectionError("apiserver unreachable")
        return "allowed"

    waiters = [asyncio.create_task(coalescer.run("alice", flaky)) for _ in range(3)]
    await entered.wait()
    release.set()
    async with asyncio.timeout(5):
        results = await asyncio.gather(*waiters, return_exceptions=True)
        assert all(isinstance(r, ConnectionError) for r in results)
        assert await coalescer.run("alice", flaky) == "allowed"
    assert attempts == 2


async def test_one_waiter_giving_up_does_not_cancel_the_others() -> None:
    coalescer: Coalescer[str, str] = Coalescer()
    entered, release = asyncio.Event(), asyncio.Event()

    async def review() -> str:
        entered.set()
        await release.wait()
        return "allowed"

    impatient = asyncio.create_task(coalescer.run("alice", review))
    patient = asyncio.create_task(coalescer.run("alice", review))
    await entered.wait()
    impatient.cancel()
    release.set()
    async with asyncio.timeout(5):
        assert await patient == "allowed"
    assert impatient.cancelled()
