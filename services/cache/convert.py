"""Protobuf <-> cache core objects, at the edge only (the server and the client use it)."""

from __future__ import annotations

from radixmesh.v1 import cache_pb2 as pb
from services.cache.core import CommitResult, Lease, PoolStats

_STATS_FIELDS = tuple(PoolStats.__slots__)  # PoolStats and pb.PoolStats share field names


def lease_to_pb(lease: Lease) -> pb.AcquireResponse:
    return pb.AcquireResponse(
        lease_id=lease.lease_id, num_cached_tokens=lease.num_cached_tokens, page_ids=lease.page_ids
    )


def lease_from_pb(executor_id: str, response: pb.AcquireResponse) -> Lease:
    return Lease(
        lease_id=response.lease_id,
        executor_id=executor_id,
        page_ids=list(response.page_ids),
        num_cached_tokens=response.num_cached_tokens,
    )


def commit_to_pb(result: CommitResult) -> pb.CommitResponse:
    return pb.CommitResponse(num_cached_tokens=result.num_cached_tokens)


def commit_from_pb(response: pb.CommitResponse) -> CommitResult:
    return CommitResult(num_cached_tokens=response.num_cached_tokens)


def match_to_pb(matches: dict[str, int]) -> pb.MatchResponse:
    return pb.MatchResponse(
        matches=[pb.PoolMatch(executor_id=e, num_cached_tokens=n) for e, n in matches.items()]
    )


def match_from_pb(response: pb.MatchResponse) -> dict[str, int]:
    return {m.executor_id: m.num_cached_tokens for m in response.matches}


def stats_to_pb(stats: list[PoolStats]) -> pb.GetStatsResponse:
    return pb.GetStatsResponse(
        pools=[pb.PoolStats(**{f: getattr(s, f) for f in _STATS_FIELDS}) for s in stats]
    )


def stats_from_pb(response: pb.GetStatsResponse) -> list[PoolStats]:
    return [PoolStats(**{f: getattr(p, f) for f in _STATS_FIELDS}) for p in response.pools]
