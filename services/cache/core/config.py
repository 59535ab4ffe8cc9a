"""Configuration of the cache core."""

from __future__ import annotations

import math
from dataclasses import dataclass

from radixmesh.errors import InvalidArgument
from services.cache.core.eviction import EVICTION_POLICIES


@dataclass(frozen=True, slots=True)
class CacheConfig:
    lease_ttl_s: float = 30.0
    """Seconds a holder keeps its leases without a heartbeat (or another verb on them)."""
    eviction_policy: str = "lru"
    """Name of the policy in `EVICTION_POLICIES` that picks which unlocked leaf goes first."""
    max_pages_per_pool: int = 2**31 - 1
    """Largest pool a register call may ask for (page ids are int32 on the wire)."""
    keep_partial_pages: bool = True
    """A commit keeps its sequence's partial last page as the tail of the node it ends at,
    and an acquire whose next tokens agree with the first slots of a cached page (such a
    tail, or the first page of an edge after its prefix) is granted a copy of them (off:
    the page is freed, and only whole pages are reused)."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.lease_ttl_s) and self.lease_ttl_s > 0):
            raise InvalidArgument(f"lease_ttl_s must be a positive number, got {self.lease_ttl_s}")
        if self.eviction_policy not in EVICTION_POLICIES:
            known = ", ".join(sorted(EVICTION_POLICIES))
            raise InvalidArgument(
                f"eviction_policy must be one of {known}, got {self.eviction_policy!r}"
            )
        if not (1 <= self.max_pages_per_pool <= 2**31 - 1):
            raise InvalidArgument(
                f"max_pages_per_pool must be in [1, 2**31 - 1], got {self.max_pages_per_pool}"
            )
