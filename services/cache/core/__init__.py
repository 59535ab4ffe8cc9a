"""The cache core: page pools, radix trees of cached prefixes and leases, with no gRPC.

core = CacheCore(CacheConfig(lease_ttl_s=30.0))
core.register_pool("exec-0", "llama", num_pages=4096, page_size=16)
lease = core.acquire("exec-0", prompt[:-1], num_tokens=len(prompt) + 64, holder="sched-0")
...  # compute KV into lease.page_ids
core.commit(lease.lease_id, computed_tokens)
"""

from radixmesh.cache_types import CommitResult, Lease, PoolStats
from services.cache.core.cache import CacheCore, Clock
from services.cache.core.config import CacheConfig
from services.cache.core.eviction import EVICTION_POLICIES, EvictionPolicy, LRUPolicy

__all__ = [
    "EVICTION_POLICIES",
    "CacheConfig",
    "CacheCore",
    "Clock",
    "CommitResult",
    "EvictionPolicy",
    "LRUPolicy",
    "Lease",
    "PoolStats",
]
