"""ShardedCache: verbs reach the shard that owns the pool or granted the lease; matches are
merged over every shard; lease ids from different shards never collide."""

from __future__ import annotations

import pytest

from mesh.engine.ports import InProcessCache
from radixmesh.errors import InvalidArgument, NotFound
from services.cache.core import CacheConfig, CacheCore
from services.scheduler.core.sharded_cache import ShardedCache

PAGE_SIZE = 4
PROMPT = list(range(10, 30))


def fleet() -> tuple[list[CacheCore], ShardedCache]:
    cores = [CacheCore(CacheConfig()), CacheCore(CacheConfig())]
    pools = {"exec-0": 0, "exec-1": 1, "exec-2": 1}
    for executor_id, index in pools.items():
        cores[index].register_pool(executor_id, "m", 32, PAGE_SIZE)
    return cores, ShardedCache([InProcessCache(c) for c in cores], pools)


def leased(core: CacheCore, executor_id: str) -> int:
    (stats,) = core.stats(executor_id)
    return stats.num_leased_pages


async def test_a_lease_lives_on_its_pools_shard_from_acquire_to_commit() -> None:
    cores, cache = fleet()
    lease = await cache.acquire("exec-2", PROMPT, len(PROMPT), "sched")
    assert lease.lease_id.startswith("1/")
    assert leased(cores[1], "exec-2") == 5 and cores[0].heartbeat("sched") == 0
    assert len(await cache.extend(lease.lease_id, 2)) == 2
    assert leased(cores[1], "exec-2") == 7
    assert (await cache.commit(lease.lease_id, PROMPT)).num_cached_tokens == 20
    assert await cache.match([*PROMPT, 99]) == {"exec-2": 20, "exec-0": 0, "exec-1": 0}


async def test_match_merges_every_shard_and_heartbeat_counts_every_lease() -> None:
    _, cache = fleet()
    first = await cache.acquire("exec-0", PROMPT, len(PROMPT), "sched")
    await cache.commit(first.lease_id, PROMPT)
    second = await cache.acquire("exec-1", PROMPT[:8], 8, "sched")
    await cache.commit(second.lease_id, PROMPT[:8])
    assert await cache.match([*PROMPT, 99]) == {"exec-0": 20, "exec-1": 8, "exec-2": 0}
    held = [await cache.acquire(e, PROMPT, len(PROMPT), "sched") for e in ("exec-0", "exec-1")]
    assert await cache.heartbeat("sched") == 2
    for lease in held:
        await cache.release(lease.lease_id)
    assert await cache.heartbeat("sched") == 0


async def test_the_same_inner_lease_id_on_two_shards_stays_two_leases() -> None:
    _, cache = fleet()
    a = await cache.acquire("exec-0", PROMPT, len(PROMPT), "sched")
    b = await cache.acquire("exec-1", PROMPT, len(PROMPT), "sched")
    assert a.lease_id != b.lease_id
    await cache.release(a.lease_id)
    assert len(await cache.extend(b.lease_id, 1)) == 1  # b untouched by a's release


async def test_unknown_executors_and_lease_ids_are_not_found_naming_them() -> None:
    _, cache = fleet()
    with pytest.raises(NotFound, match="'exec-9' has no cache shard"):
        await cache.acquire("exec-9", PROMPT, len(PROMPT), "sched")
    for lease_id in ("no-shard", "7/abc", "x/abc"):
        with pytest.raises(NotFound, match="names no cache shard"):
            await cache.extend(lease_id, 1)
    with pytest.raises(NotFound):  # the shard exists, the lease does not
        await cache.release("0/unknown")


def test_a_pool_on_a_shard_that_does_not_exist_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="names shard 2, of 1"):
        ShardedCache([InProcessCache(CacheCore(CacheConfig()))], {"exec-0": 2})
