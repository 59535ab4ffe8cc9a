"""Factories for the cache room's unit tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from services.cache.core import CacheConfig, CacheCore
from tests.fixtures.redis import redis_server, redis_server_factory  # noqa: F401


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_core(clock: FakeClock) -> Callable[..., CacheCore]:
    """A core with one pool "exec-0" of model "m" (pass num_pages=0 for none)."""

    def make(
        num_pages: int = 16,
        page_size: int = 4,
        lease_ttl_s: float = 30.0,
        keep_partial_pages: bool = True,
    ) -> CacheCore:
        config = CacheConfig(lease_ttl_s=lease_ttl_s, keep_partial_pages=keep_partial_pages)
        core = CacheCore(config, clock=clock)
        if num_pages:
            core.register_pool("exec-0", "m", num_pages, page_size)
        return core

    return make
