"""Result cache and session store: `make_store(config)` picks the backend.

store = make_store(StoreConfig(redis_url="redis://127.0.0.1:6379/0"))  # or no URL: in-process
await store.put_result(result_key(model, token_ids, sampling, constraint), payload)
"""

from __future__ import annotations

import time
from collections.abc import Callable

from radixmesh.result_key import result_key
from services.cache.store.base import Store, StoreConfig
from services.cache.store.memory import InProcessStore
from services.cache.store.redis_store import RedisStore


def make_store(config: StoreConfig, clock: Callable[[], float] = time.monotonic) -> Store:
    """The Redis store when `config.redis_url` is set, else the in-process one."""
    if config.redis_url:
        return RedisStore(config)
    return InProcessStore(config, clock=clock)


__all__ = ["InProcessStore", "RedisStore", "Store", "StoreConfig", "make_store", "result_key"]
