"""Cache core objects -> protobuf, at the server's edge (the client's direction,
protobuf -> objects, lives with the client in `services.cache.client`)."""

from __future__ import annotations

from radixmesh.v1 import cache_pb2 as pb
from radixmesh.wire import page_copy_to_proto
from services.cache.core import CommitResult, Lease, PoolStats

_STATS_FIELDS = tuple(PoolStats.__slots__)  # PoolStats and pb.PoolStats share field names


def lease_to_pb(lease: Lease) -> pb.AcquireResponse:
    msg = pb.AcquireResponse(
        lease_id=lease.lease_id, num_cached_tokens=lease.num_cached_tokens, page_ids=lease.page_ids
    )
    if lease.page_copy is not None:
        msg.page_copy.CopyFrom(page_copy_to_proto(lease.page_copy))
    return msg


def commit_to_pb(result: CommitResult) -> pb.CommitResponse:
    return pb.CommitResponse(
        num_cached_tokens=result.num_cached_tokens, num_locked_pages=result.num_locked_pages
    )


def match_to_pb(matches: dict[str, int]) -> pb.MatchResponse:
    return pb.MatchResponse(
        matches=[pb.PoolMatch(executor_id=e, num_cached_tokens=n) for e, n in matches.items()]
    )


def stats_to_pb(stats: list[PoolStats]) -> pb.GetStatsResponse:
    return pb.GetStatsResponse(
        pools=[pb.PoolStats(**{f: getattr(s, f) for f in _STATS_FIELDS}) for s in stats]
    )
