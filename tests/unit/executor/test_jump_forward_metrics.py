"""The executor's forced-token counter follows the step results, and radixmesh bench's
report reads it."""

from __future__ import annotations

from mesh.loadgen.report import speculation_block
from radixmesh.step import RunningSequence, SequenceOutput, StepPlan, StepResult
from services.common.metrics import REGISTRY
from services.executor.metrics import StepMetrics

FORCED = "radixmesh_executor_spec_forced_tokens_total"


def sample(name: str) -> float:
    value = REGISTRY.get_sample_value(name)
    return 0.0 if value is None else value


def test_forced_tokens_are_counted() -> None:
    metrics = StepMetrics.create()
    before = sample(FORCED)
    plan = StepPlan(3, running_seqs=[RunningSequence(r, 1, [], 8) for r in "abc"])
    result = StepResult(
        3,
        [
            SequenceOutput("a", 5, accepted_token_ids=[1, 2, 3], num_draft_tokens=3, num_forced_tokens=3),
            SequenceOutput("b", 6, accepted_token_ids=[4], num_draft_tokens=4, num_forced_tokens=1),
            SequenceOutput("c", 7),
        ],
    )
    metrics.record(plan, result, 3)
    assert sample(FORCED) - before == 4


def test_the_bench_report_carries_forced_tokens() -> None:
    def snap(drafts: float, tokens: float, accepted: float, forced: float | None):
        key = frozenset({("endpoint", "executor-0")})
        counters = {
            ("radixmesh_executor_spec_drafts_total", key): drafts,
            ("radixmesh_executor_spec_draft_tokens_total", key): tokens,
            ("radixmesh_executor_spec_accepted_tokens_total", key): accepted,
        }
        if forced is not None:
            counters[(FORCED, key)] = forced
        return {"executor": counters}

    block = speculation_block(snap(1, 4, 2, 1), snap(11, 44, 32, 21))
    assert block is not None and block["num_forced_tokens"] == 20
    older = speculation_block(snap(1, 4, 2, None), snap(11, 44, 32, None))  # no counter yet
    assert older is not None and older["num_forced_tokens"] == 0
