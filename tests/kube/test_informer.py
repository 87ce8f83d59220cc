"""The informer against a fake apiserver: list, watch, 410 relist, bookmarks, backoff, relist."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

from subres.kube import client
from subres.kube.cache import ParentCache
from subres.kube.informer import Backoff, Informer, InformerSettings
from tests.fakeapi import FakeApiServer, start_fake
from tests.support import machine

FAST = InformerSettings(backoff_initial=0.01, backoff_max=0.05)


class Recording(ParentCache):
    """A parent cache that signals every change, so tests wait on events, not time."""

    def __init__(self) -> None:
        super().__init__("machines")
        self.changed = asyncio.Condition()
        self.replaced = 0

    def replace(self, objects: Iterable[Mapping[str, Any]]) -> None:
        super().replace(objects)
        self.replaced += 1
        self._notify()

    def upsert(self, obj: Mapping[str, Any]) -> None:
        super().upsert(obj)
        self._notify()

    def delete(self, obj: Mapping[str, Any]) -> None:
        super().delete(obj)
        self._notify()

    def _notify(self) -> None:
        async def notify() -> None:
            async with self.changed:
                self.changed.notify_all()

        task = asyncio.ensure_future(notify())
        task.add_done_callback(lambda _: None)

    async def wait(self, predicate: Callable[[], bool]) -> None:
        async with asyncio.timeout(5), self.changed:
            await self.changed.wait_for(predicate)


@contextlib.asynccontextmanager
async def informing(
    tmp_path: Path, settings: InformerSettings = FAST
) -> AsyncIterator[tuple[FakeApiServer, Recording, asyncio.Task[None]]]:
    async with start_fake(tmp_path) as fake:
        api = await client.connect(fake.kubeconfig())
        cache = Recording()
        source = client.CustomObjects(api, "subres.dev", "v1alpha1", "machines")
        informer = Informer(source=source, sink=cache, name="machines", settings=settings)
        task = asyncio.create_task(informer.run())
        try:
            yield fake, cache, task
        finally:
            task.cancel()
            await asyncio.wait([task], timeout=5)
            await api.close()


def phase(cache: ParentCache, name: str) -> str | None:
    obj = cache.get("default", name)
    return None if obj is None else str(obj["status"]["phase"])


async def test_create_modify_delete_are_reflected(tmp_path: Path) -> None:
    async with informing(tmp_path) as (fake, cache, _):
        for name in ("a", "b", "c"):
            await fake.put(machine(name))
        await cache.wait(lambda: cache.synced and len(cache) == 3)
        await fake.put(machine("d", phase="Stopped"))
        await cache.wait(lambda: phase(cache, "d") == "Stopped")
        await fake.put(machine("d", phase="Running"))
        await cache.wait(lambda: phase(cache, "d") == "Running")
        await fake.remove("default", "d")
        await cache.wait(lambda: cache.get("default", "d") is None)
        assert cache.replaced == 1


async def test_not_synced_before_the_first_list_and_backoff_on_errors(tmp_path: Path) -> None:
    async with start_fake(tmp_path) as fake:
        fake.fail_lists = 3
        api = await client.connect(fake.kubeconfig())
        cache = Recording()
        source = client.CustomObjects(api, "subres.dev", "v1alpha1", "machines")
        task = asyncio.create_task(
            Informer(source=source, sink=cache, name="m", settings=FAST).run()
        )
        await fake.wait(lambda: fake.calls["list:machines"] >= 1)
        assert not cache.synced
        await cache.wait(lambda: cache.synced)
        assert fake.calls["list:machines"] == 4
        task.cancel()
        await asyncio.wait([task], timeout=5)
        await api.close()


def test_backoff_grows_with_jitter_and_is_bounded() -> None:
    settings = InformerSettings(backoff_initial=1, backoff_max=10, backoff_factor=2, jitter=0.5)
    backoff = Backoff(settings, rng=random.Random(7))
    delays = [backoff.next() for _ in range(8)]
    assert 1 <= delays[0] <= 1.5
    assert 2 <= delays[1] <= 3
    assert all(d <= 10 for d in delays)
    assert delays[-1] == 10
    backoff.reset()
    assert backoff.next() <= 1.5


async def test_relist_on_410_gone(tmp_path: Path) -> None:
    async with informing(tmp_path) as (fake, cache, _):
        await fake.put(machine("a"))
        await cache.wait(lambda: cache.synced and len(cache) == 1)
        await fake.wait(lambda: fake.open_watches == 1)
        await fake.expire()
        await fake.put(machine("b"))
        await cache.wait(lambda: cache.replaced == 2 and len(cache) == 2)
        assert fake.calls["list:machines"] == 2


async def test_bookmark_moves_the_resume_version(tmp_path: Path) -> None:
    async with informing(tmp_path) as (fake, cache, _):
        await cache.wait(lambda: cache.synced)
        await fake.wait(lambda: fake.open_watches == 1)
        await fake.bookmark(500)
        await fake.put(machine("after-bookmark"))
        await cache.wait(lambda: len(cache) == 1)
        await fake.end_watches()
        await fake.wait(lambda: fake.calls["watch:machines"] == 2)
        assert fake.watch_versions == ["100", "501"]
        assert fake.calls["list:machines"] == 1


async def test_periodic_full_relist(tmp_path: Path) -> None:
    settings = InformerSettings(relist_interval=0.3, backoff_initial=0.01)
    async with informing(tmp_path, settings) as (fake, cache, _):
        await cache.wait(lambda: cache.replaced >= 2)
        assert fake.calls["list:machines"] >= 2


async def test_cancel_stops_cleanly(tmp_path: Path) -> None:
    async with informing(tmp_path) as (fake, cache, task):
        await cache.wait(lambda: cache.synced)
        await fake.wait(lambda: fake.open_watches == 1)
        task.cancel()
        await asyncio.wait([task], timeout=5)
        assert task.cancelled()


async def test_watch_error_event_is_an_api_error(tmp_path: Path) -> None:
    async with start_fake(tmp_path) as fake:
        api = await client.connect(fake.kubeconfig())
        source = client.CustomObjects(api, "subres.dev", "v1alpha1", "missing")
        with pytest.raises(client.ApiError) as raised:
            await source.list(limit=1, continue_token="")
        assert raised.value.status == 404
        await api.close()
