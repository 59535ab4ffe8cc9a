"""Typed results of the cache core's verbs (defined in `radixmesh.cache_types`,
shared with the cache's clients)."""

from __future__ import annotations

from radixmesh.cache_types import CommitResult, Lease, PoolStats

__all__ = ["CommitResult", "Lease", "PoolStats"]
