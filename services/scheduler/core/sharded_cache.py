"""A CachePort over several cache shards, each owning whole executor pools.

A pool (pages, leases, tree) lives in exactly one shard, so every verb about a pool or a
lease goes to one shard: acquire to the executor's shard, extend / commit / release to
the shard that granted the lease (its id carries the shard: "<shard>/<id>"), and no state
is kept here. `match` is fanned out to every shard at once and merged, so routing sees
every pool as with one cache (docs/architecture.md, "The cache service at fleet scale");
`heartbeat` renews the holder's leases on every shard.

    cache = ShardedCache([RemoteCache(c0), RemoteCache(c1)], {"exec-0": 0, "exec-1": 1})
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping, Sequence

from radixmesh.cache_types import CommitResult, Lease
from radixmesh.errors import InvalidArgument, NotFound
from services.scheduler.core.ports import CachePort


class ShardedCache:
    def __init__(self, shards: Sequence[CachePort], pools: Mapping[str, int]) -> None:
        """`pools`: executor id -> index of the shard its pool is registered with."""
        if not shards:
            raise InvalidArgument("cache shards: at least one is needed")
        for executor_id, index in pools.items():
            if not 0 <= index < len(shards):
                raise InvalidArgument(
                    f"cache shards: executor {executor_id!r} names shard {index}, "
                    f"of {len(shards)}"
                )
        self._shards = list(shards)
        self._pools = dict(pools)

    def _pool_shard(self, executor_id: str) -> CachePort:
        index = self._pools.get(executor_id)
        if index is None:
            raise NotFound(f"executor_id {executor_id!r} has no cache shard")
        return self._shards[index]

    def _lease_shard(self, lease_id: str) -> tuple[CachePort, str]:
        index, sep, inner = lease_id.partition("/")
        if not sep or not index.isdigit() or int(index) >= len(self._shards):
            raise NotFound(f"lease_id {lease_id!r} names no cache shard")
        return self._shards[int(index)], inner

    async def match(self, token_ids: list[int], model: str | None = None) -> dict[str, int]:
        merged: dict[str, int] = {}
        for found in await asyncio.gather(*(s.match(token_ids, model) for s in self._shards)):
            merged.update(found)
        return merged

    async def acquire(
        self, executor_id: str, token_ids: list[int], num_tokens: int, holder: str
    ) -> Lease:
        index = self._pools.get(executor_id)
        lease = await self._pool_shard(executor_id).acquire(
            executor_id, token_ids, num_tokens, holder
        )
        return dataclasses.replace(lease, lease_id=f"{index}/{lease.lease_id}")

    async def extend(self, lease_id: str, num_pages: int) -> list[int]:
        shard, inner = self._lease_shard(lease_id)
        return await shard.extend(inner, num_pages)

    async def commit(
        self, lease_id: str, token_ids: list[int], keep_locked: bool = False
    ) -> CommitResult:
        shard, inner = self._lease_shard(lease_id)
        return await shard.commit(inner, token_ids, keep_locked)

    async def release(self, lease_id: str) -> None:
        shard, inner = self._lease_shard(lease_id)
        await shard.release(inner)

    async def heartbeat(self, holder: str) -> int:
        return sum(await asyncio.gather(*(s.heartbeat(holder) for s in self._shards)))
