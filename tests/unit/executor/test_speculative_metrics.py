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


def families(collector) -> dict[str, dict[tuple[str, ...], float]]:
    return {
        f.name: {tuple(s.labels.values()): s.value for s in f.samples}
        for f in collector.collect()
    }


def test_the_switch_state_is_exported_at_scrape_time() -> None:
    """What the switch weighs is on /metrics: its decisions, the wall ratio per bucket
    once both kinds of step are timed, the start-up ratio and the probe interval."""
    from services.executor.core.spec.switch import MIN_STEP_SAMPLES, PROBE_EVERY, SpecSwitch
    from services.executor.metrics import SpecSwitchCollector

    switch = SpecSwitch.measured({1: (0.010, 0.0125), 8: (0.010, 0.030)}, 5, 8)
    collector = SpecSwitchCollector(switch.describe)
    before = families(collector)
    assert "radixmesh_executor_spec_wall_ratio" not in before  # nothing timed yet
    assert before["radixmesh_executor_spec_cost_ratio"] == {("1",): 1.25, ("8",): 3.0}
    assert before["radixmesh_executor_spec_probe_interval_steps"] == {(): PROBE_EVERY}
    for _ in range(MIN_STEP_SAMPLES):
        switch.observe_step(8, 0.010, speculating=False)
        switch.observe_step(8, 0.025, speculating=True)
    switch.num_declined, switch.num_probes = 7, 2
    after = families(collector)
    assert after["radixmesh_executor_spec_wall_ratio"] == {("8",): 2.5}
    steps = after["radixmesh_executor_spec_switch_steps"]
    assert steps == {("declined",): 7, ("probe",): 2, ("plain_probe",): 0}


def test_a_state_read_while_the_step_thread_writes_is_read_again() -> None:
    from services.executor.metrics import SpecSwitchCollector

    reads = iter([RuntimeError("dictionary changed size during iteration"), {"num_probes": 3}])

    def describe():
        read = next(reads)
        if isinstance(read, Exception):
            raise read
        return read

    collected = families(SpecSwitchCollector(describe))
    assert collected["radixmesh_executor_spec_switch_steps"][("probe",)] == 3
    assert families(SpecSwitchCollector(lambda: None)) == {}  # speculation off: absent
