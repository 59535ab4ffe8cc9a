"""Speculative decoding fields of the step contract and executor info survive the wire."""

from __future__ import annotations

from radixmesh import wire
from radixmesh.executor_info import ExecutorInfo
from radixmesh.step import RunningSequence, SequenceOutput, StepPlan, StepResult


def test_plan_result_and_info_carry_drafts():
    plan = StepPlan(3, running_seqs=[RunningSequence("a", 1, [7], 4), RunningSequence("b", 1)])
    back = wire.plan_from_proto(wire.plan_to_proto(plan))
    assert [(r.req_id, r.num_draft_tokens) for r in back.running_seqs] == [("a", 4), ("b", 0)]
    result = StepResult(
        3,
        [
            SequenceOutput("a", 9, accepted_token_ids=[5, 6], num_draft_tokens=4),
            SequenceOutput("b", 8),
        ],
    )
    outs = wire.result_from_proto(wire.result_to_proto(result)).outputs
    assert [(o.token_id, o.accepted_token_ids, o.num_draft_tokens) for o in outs] == [
        (9, [5, 6], 4),
        (8, [], 0),
    ]
    info = ExecutorInfo("e0", "m", 16, 100, 2048, max_draft_tokens=4, max_speculative_batch_size=32)
    again = wire.info_from_proto(wire.info_to_proto(info))
    assert (again.max_draft_tokens, again.max_speculative_batch_size) == (4, 32)
