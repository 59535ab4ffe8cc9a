"""The executor's speculative decoding metrics follow the step results' draft counts."""

from __future__ import annotations

from radixmesh.step import RunningSequence, SequenceOutput, StepPlan, StepResult
from services.common.metrics import REGISTRY
from services.executor.metrics import StepMetrics


def sample(name: str, **labels: str) -> float:
    value = REGISTRY.get_sample_value(name, labels or None)
    return 0.0 if value is None else value


def test_drafts_accepted_tokens_and_positions_are_counted() -> None:
    metrics = StepMetrics.create()
    names = (
        "radixmesh_executor_spec_drafts_total",
        "radixmesh_executor_spec_draft_tokens_total",
        "radixmesh_executor_spec_accepted_tokens_total",
    )
    before = [sample(n) for n in names]
    positions = [sample("radixmesh_executor_spec_accepted_by_position_total", position=str(j)) for j in range(3)]
    plan = StepPlan(7, running_seqs=[RunningSequence(r, 1, [], 4) for r in "abc"])
    result = StepResult(
        7,
        [
            SequenceOutput("a", 5, accepted_token_ids=[1, 2, 3], num_draft_tokens=4),
            SequenceOutput("b", 6, accepted_token_ids=[], num_draft_tokens=2),
            SequenceOutput("c", 7),  # decoded without a draft
        ],
    )
    metrics.record(plan, result, 3)
    assert [sample(n) - b for n, b in zip(names, before, strict=True)] == [2, 6, 3]
    after = [sample("radixmesh_executor_spec_accepted_by_position_total", position=str(j)) for j in range(3)]
    assert [a - b for a, b in zip(after, positions, strict=True)] == [1, 1, 1]
