"""The servicer's conversions and Batch op handling, without a server."""

from __future__ import annotations

import grpc

from radixmesh.v1 import cache_pb2 as pb
from services.cache import client as cache_client
from services.cache import convert
from services.cache.server import CacheServicer
from services.cache.store import InProcessStore, StoreConfig


def make_servicer(make_core, clock) -> CacheServicer:
    return CacheServicer(make_core(), InProcessStore(StoreConfig(), clock=clock))


def test_batch_ops_answer_in_kind_and_errors_become_codes(make_core, clock):
    servicer = make_servicer(make_core, clock)
    acquired = servicer.run_op(
        pb.CacheOp(
            op_id=7,
            acquire=pb.AcquireRequest(
                executor_id="exec-0", token_ids=[1, 2, 3, 4, 5], num_tokens=8, holder="h"
            ),
        )
    )
    assert (acquired.op_id, acquired.error_code, acquired.WhichOneof("result")) == (7, 0, "acquire")
    assert len(acquired.acquire.page_ids) == 2
    committed = servicer.run_op(
        pb.CacheOp(
            op_id=8,
            commit=pb.CommitRequest(lease_id=acquired.acquire.lease_id, token_ids=[1, 2, 3, 4, 5]),
        )
    )
    assert committed.commit.num_cached_tokens == 4
    cases = {
        9: (
            pb.CacheOp(op_id=9, release=pb.ReleaseRequest(lease_id="gone")),
            grpc.StatusCode.NOT_FOUND,
        ),
        10: (
            pb.CacheOp(op_id=10, extend=pb.ExtendRequest(lease_id="gone", num_pages=1)),
            grpc.StatusCode.NOT_FOUND,
        ),
        11: (pb.CacheOp(op_id=11), grpc.StatusCode.INVALID_ARGUMENT),
        12: (
            pb.CacheOp(
                op_id=12,
                acquire=pb.AcquireRequest(executor_id="exec-0", num_tokens=10_000, holder="h"),
            ),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
        ),
    }
    for op_id, (op, code) in cases.items():
        result = servicer.run_op(op)
        assert (result.op_id, result.error_code) == (op_id, code.value[0])
        assert result.error_message and result.WhichOneof("result") is None


def test_stats_and_match_convert_both_ways(make_core):
    core = make_core()
    core.register_pool("exec-1", "m", 8, 2)
    lease = core.acquire("exec-0", [1, 2, 3, 4], 4, "h")
    core.commit(lease.lease_id, [1, 2, 3, 4])
    assert cache_client.stats_from_pb(convert.stats_to_pb(core.stats())) == core.stats()
    matches = core.match([1, 2, 3, 4])
    assert (
        cache_client.match_from_pb(convert.match_to_pb(matches))
        == matches
        == {"exec-0": 4, "exec-1": 0}
    )
    again = core.acquire("exec-0", [1, 2, 3, 4], 6, "h")
    assert cache_client.lease_from_pb("exec-0", convert.lease_to_pb(again)) == again
    held = core.commit(again.lease_id, [1, 2, 3, 4, 5], keep_locked=True)
    assert held.num_locked_pages == 2  # the whole page and the partial one
    wire = cache_client.commit_from_pb(convert.commit_to_pb(held))
    assert (wire.num_cached_tokens, wire.num_locked_pages) == (4, 2)
    # token-granular on the wire too: the whole page and the kept partial page's token
    matches = core.match([1, 2, 3, 4, 5, 6])
    assert cache_client.match_from_pb(convert.match_to_pb(matches)) == matches == {
        "exec-0": 5,
        "exec-1": 0,
    }
