"""A partial page's copy on the wire: the lease that grants it and the plan that runs it."""

from __future__ import annotations

from radixmesh.cache_types import Lease, PageCopy
from radixmesh.sampling import SamplingParams
from radixmesh.step import NewSequence, StepPlan
from radixmesh.wire import plan_from_proto, plan_to_proto
from services.cache import client as cache_client
from services.cache import convert


def test_a_lease_carries_its_copy_and_a_lease_without_one_carries_none() -> None:
    copy = PageCopy(src_page_id=7, dst_page_id=3, num_tokens=5)
    lease = Lease("l-1", "exec-0", [1, 2, 3], 8, copy)
    wire = convert.lease_to_pb(lease)
    assert wire.HasField("page_copy")
    assert cache_client.lease_from_pb("exec-0", wire) == lease
    plain = Lease("l-2", "exec-0", [4], 0)
    wire = convert.lease_to_pb(plain)
    assert not wire.HasField("page_copy")
    assert cache_client.lease_from_pb("exec-0", wire).page_copy is None


def test_a_new_sequence_carries_its_copy_through_the_plan() -> None:
    copy = PageCopy(src_page_id=9, dst_page_id=4, num_tokens=2)
    seqs = [
        NewSequence("a", [1] * 10, 10, 10, 0, [0, 1, 4], SamplingParams(), page_copy=copy),
        NewSequence("b", [2] * 3, 3, 0, 3, [5], SamplingParams()),
    ]
    plan = StepPlan(3, new_seqs=seqs)
    wire = plan_to_proto(plan)
    assert wire.new_seqs[0].HasField("page_copy") and not wire.new_seqs[1].HasField("page_copy")
    back = plan_from_proto(wire)
    assert [s.page_copy for s in back.new_seqs] == [copy, None]
