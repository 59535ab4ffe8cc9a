"""Jump-forward fields survive the wire: the executor's max_forced_tokens, a step output's
forced tokens, and a request's count in its speculation usage (update, Complete, OpenAI)."""

from __future__ import annotations

from gateway.core.openai_responses import speculation_json, sum_speculation
from radixmesh import wire
from radixmesh.executor_info import ExecutorInfo
from radixmesh.speculation import SpecUsage
from radixmesh.step import SequenceOutput, StepResult
from radixmesh.updates import RequestUpdate
from radixmesh.v1 import inference_pb2


def test_step_output_and_info_carry_forced_tokens():
    result = StepResult(
        4,
        [
            SequenceOutput("a", 9, accepted_token_ids=[5, 6, 7], num_draft_tokens=5, num_forced_tokens=2),
            SequenceOutput("b", 8),
        ],
    )
    outs = wire.result_from_proto(wire.result_to_proto(result)).outputs
    assert [(o.num_draft_tokens, o.num_forced_tokens) for o in outs] == [(5, 2), (0, 0)]
    info = ExecutorInfo("e0", "m", 16, 100, 2048, max_forced_tokens=8)
    assert wire.info_from_proto(wire.info_to_proto(info)).max_forced_tokens == 8
    assert wire.info_from_proto(wire.info_to_proto(ExecutorInfo("e", "m", 16, 1, 9))).max_forced_tokens == 0


def test_request_usage_carries_forced_tokens():
    usage = SpecUsage()
    usage.record(4, 3, 2)
    usage.record(1, 1, 1)
    assert (usage.num_drafts, usage.num_accepted_tokens, usage.num_forced_tokens) == (2, 4, 3)
    update = RequestUpdate("r", finish_reason="stop", speculation=usage)
    assert wire.update_from_proto(wire.update_to_proto(update)).speculation == usage
    msg = inference_pb2.SpeculationUsage()
    wire.speculation_to_proto(usage, msg)
    assert msg.num_forced_tokens == 3
    total = sum_speculation([usage, SpecUsage(1, 2, 2, [1, 1], 2), None])
    assert total is not None and total.num_forced_tokens == 5
    assert speculation_json(total)["num_forced_tokens"] == 5
