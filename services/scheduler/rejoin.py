"""Bring failed parts back into a running scheduler: executors that restart, a cache that restarts.

    rejoin = Rejoin(core, cache_client, {"exec-0": "127.0.0.1:50054"}, cache_address)
    rejoin.start()      # core.on_executor_lost is wired; the cache is watched
    ...
    await rejoin.close()

An executor whose Step stream fails is taken out by the core (requests that
streamed nothing move to another executor, the rest end UNAVAILABLE). Here,
its pool is unregistered from the cache (its KV tensors died with it, so no
prefix of the old pool may be matched again), then the executor's address is
health-checked until a process serves there again (the supervisor restarts
it on the same address, or an operator does); it is connected (GetInfo and a
new Step stream) and readmitted. Meanwhile the cache service is watched:
when it goes away every request holding a lease ends (`core.cache_lost`);
the executors register their pools again when it is back. With cache shards
every shard is watched (losing any one ends the leased requests) and a dead
executor's pool is unregistered from whichever shard holds it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from radixmesh.errors import RadixmeshError
from services.cache.client import CacheClient
from services.common.health import follow_serving, wait_for_serving
from services.common.logging import get_logger
from services.scheduler.core import SchedulerCore
from services.scheduler.remote import RemoteExecutor

log = get_logger(__name__)

RETRY_S = 0.5
"""Pause between connection attempts to an executor that is not back yet."""
EXECUTOR_SERVICE = "radixmesh.v1.Executor"


async def _serving(address: str) -> bool:
    """One health check: does a process serve at address now?"""
    try:
        await wait_for_serving(address, EXECUTOR_SERVICE, timeout=0.5)
    except (TimeoutError, ConnectionError):
        return False
    return True


class Rejoin:
    def __init__(
        self,
        core: SchedulerCore,
        cache: CacheClient | Sequence[CacheClient],
        addresses: dict[str, str],
        cache_address: str | Sequence[str],
        connect_timeout_s: float = 60.0,
    ) -> None:
        """`cache` and `cache_address`: the cache service, or its shards (in the same order)."""
        self._caches = [cache] if isinstance(cache, CacheClient) else list(cache)
        self._core = core
        self._addresses = dict(addresses)
        """Executor id -> its address."""
        self._cache_addresses = (
            [cache_address] if isinstance(cache_address, str) else list(cache_address)
        )
        self._timeout = connect_timeout_s
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._watches: dict[str, asyncio.Task[None]] = {}

    def start(self) -> None:
        self._core.on_executor_lost = self.executor_lost
        for i, address in enumerate(self._cache_addresses):
            self._tasks[f"cache-{i}"] = asyncio.create_task(
                follow_serving(address, "", self._cache_watcher(address)), name=f"watch-cache-{i}"
            )
        for executor_id, address in self._addresses.items():
            self._watches[executor_id] = asyncio.create_task(
                self._watch(executor_id, address), name=f"watch-{executor_id}"
            )

    async def _watch(self, executor_id: str, address: str) -> None:
        """An executor that dies while idle is noticed at once, not at its next request."""

        def changed(serving: bool, reason: str) -> None:
            if not serving:
                self._core.executor_lost(executor_id, f"executor {executor_id}: {reason}")

        await follow_serving(address, EXECUTOR_SERVICE, changed)

    def executor_lost(self, executor_id: str) -> None:
        """Start bringing `executor_id` back (once; a second call while it is underway is
        a no-op)."""
        task = self._tasks.get(executor_id)
        if executor_id not in self._addresses or (task is not None and not task.done()):
            return
        self._tasks[executor_id] = asyncio.create_task(
            self._rejoin(executor_id), name=f"rejoin-{executor_id}"
        )

    async def _rejoin(self, executor_id: str) -> None:
        address = self._addresses[executor_id]
        if not await _serving(address):  # a new process registers its pool before serving
            for cache in self._caches:  # the shard holding the pool; NotFound on the others
                try:
                    num_leases = await cache.unregister_pool(executor_id)
                    log.info("dead_pool_unregistered", executor_id=executor_id, num_leases=num_leases)
                except RadixmeshError as exc:  # gone already, or the cache is down too
                    if len(self._caches) == 1:
                        log.warning("dead_pool_unregister_failed", executor_id=executor_id,
                                    error=str(exc))  # fmt: skip
        while True:
            port = RemoteExecutor(address, self._timeout)
            try:
                await port.connect()  # health-checked: SERVING, GetInfo, a new Step stream
            except RadixmeshError as exc:
                log.info("executor_not_back", executor_id=executor_id, error=str(exc))
                await port.close()
                await asyncio.sleep(RETRY_S)
                continue
            if port.info.executor_id != executor_id:
                log.error("executor_changed_id", address=address, executor_id=port.info.executor_id)
                await port.close()
                await asyncio.sleep(RETRY_S)
                continue
            self._core.readmit(port)
            return

    def _cache_watcher(self, address: str):
        def changed(serving: bool, reason: str) -> None:
            if serving:
                log.info("cache_serving", address=address)
            else:
                log.error("cache_lost", address=address, reason=reason)
                self._core.cache_lost(reason)

        return changed

    async def close(self) -> None:
        tasks = [*self._tasks.values(), *self._watches.values()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
