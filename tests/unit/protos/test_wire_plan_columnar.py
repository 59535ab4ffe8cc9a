"""A plan's plain decode rows cross the wire columnar; the other running rows as messages,
in order."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixmesh import wire
from radixmesh.errors import InvalidArgument
from radixmesh.step import RunningSequence, StepPlan
from radixmesh.v1 import executor_pb2


def through_bytes(plan: StepPlan, columnar: bool = True) -> executor_pb2.StepPlan:
    return executor_pb2.StepPlan.FromString(wire.plan_to_proto(plan, columnar).SerializeToString())


def mixed_rows() -> list[RunningSequence]:
    """Plain decodes around a page append, a prefill chunk and a draft."""
    return [
        RunningSequence("a", 1),
        RunningSequence("page", 1, [7]),
        RunningSequence("b", 1),
        RunningSequence("c", 1),
        RunningSequence("chunk", 64, [8, 9]),
        RunningSequence("draft", 1, [], 3),
        RunningSequence("d", 1),
    ]


def test_plain_decodes_go_columnar_and_the_others_keep_their_rows():
    plan = StepPlan(5, running_seqs=mixed_rows(), finished_req_ids=["gone"])
    msg = through_bytes(plan)
    assert list(msg.decode_req_ids) == ["a", "b", "c", "d"]
    assert [r.req_id for r in msg.running_seqs] == ["page", "chunk", "draft"]
    assert list(msg.running_rows) == [1, 4, 5]
    assert wire.plan_from_proto(msg) == plan


def test_a_plan_of_only_plain_or_only_other_rows():
    plain = [RunningSequence(f"r{i}", 1) for i in range(5)]
    msg = through_bytes(StepPlan(1, running_seqs=plain))
    assert len(msg.running_seqs) == 0 and not msg.running_rows and len(msg.decode_req_ids) == 5
    assert wire.plan_from_proto(msg).running_seqs == plain
    other = [RunningSequence("x", 16, [1]), RunningSequence("y", 1, [], 2)]
    msg = through_bytes(StepPlan(2, running_seqs=other))
    assert not msg.decode_req_ids and not msg.running_rows  # as a writer before the columns
    assert wire.plan_from_proto(msg).running_seqs == other


def test_a_plan_of_the_old_layout_reads_the_same():
    plan = StepPlan(4, running_seqs=mixed_rows())
    msg = through_bytes(plan, columnar=False)
    assert not msg.decode_req_ids and len(msg.running_seqs) == len(plan.running_seqs)
    assert wire.plan_from_proto(msg) == plan


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"running_rows": [1, 2]}, r"running_rows needs decode_req_ids"),
        ({"decode_req_ids": ["a"]}, r"running_rows has 0 entries, running_seqs 2"),
        ({"decode_req_ids": ["a"], "running_rows": [1, 0]}, r"running_rows must increase"),
        ({"decode_req_ids": ["a"], "running_rows": [0, 3]}, r"below the plan's 3 running rows"),
        ({"decode_req_ids": ["a", ""], "running_rows": [0, 1]}, r"req_id must not be empty"),
    ],
)
def test_columns_that_disagree_are_refused_naming_the_field(fields, match):
    msg = executor_pb2.StepPlan(step_id=9, **fields)
    msg.running_seqs.add(req_id="x", num_scheduled_tokens=4)
    msg.running_seqs.add(req_id="y", num_scheduled_tokens=1, num_draft_tokens=2)
    with pytest.raises(InvalidArgument, match=match):
        wire.plan_from_proto(msg)


running_rows = st.lists(
    st.one_of(
        st.builds(RunningSequence, st.text(min_size=1, max_size=6), st.just(1)),
        st.builds(
            RunningSequence,
            st.text(min_size=1, max_size=6),
            st.integers(1, 512),
            st.lists(st.integers(0, 2**31 - 1), max_size=3),
            st.integers(0, 8),
        ),
    ),
    max_size=24,
)


@settings(max_examples=200, deadline=None)
@given(running_rows)
def test_any_rows_come_back_in_their_order(rows):
    plan = StepPlan(3, running_seqs=rows)
    assert wire.plan_from_proto(through_bytes(plan)) == plan
    assert wire.plan_from_proto(through_bytes(plan, columnar=False)) == plan
