"""The scheduler's depth toward one executor: deeper on plans that came late, back down
after a run of plans in time."""

from __future__ import annotations

from radixmesh.step import StepResult
from services.scheduler.core.pipeline_depth import CALM_PLANS, FLOOR, PipelineDepth


def answer(depth: PipelineDepth, step_id: int, gap: float, *, in_flight: int = 1) -> None:
    """Plan `step_id` sent with `in_flight` steps before it; its first step's result says
    the executor had been idle `gap` seconds (a step of 10 ms)."""
    depth.sent(step_id, in_flight)
    depth.answered(StepResult(step_id, step_seconds=0.01, idle_gap_s=gap))


def test_late_plans_sent_in_flight_deepen_it_one_step_each_up_to_the_ceiling():
    depth = PipelineDepth(ceiling=4)
    assert depth.target == FLOOR == 2
    answer(depth, 1, 0.002)
    assert (depth.target, depth.num_late) == (3, 1)
    answer(depth, 2, 0.002)
    answer(depth, 3, 0.002)
    assert (depth.target, depth.num_late) == (4, 3)  # the ceiling


def test_gaps_that_say_nothing_of_the_depth_are_ignored():
    depth = PipelineDepth(ceiling=4)
    answer(depth, 1, 0.002, in_flight=0)  # sent to an idle executor: a gap is expected
    answer(depth, 2, 0.0005)  # under a tenth of the 10 ms step: a hand-over
    depth.sent(3, 1)
    depth.answered(StepResult(3, step_seconds=0.01, substep=1, idle_gap_s=0.5))  # not a first step
    depth.answered(StepResult(4, step_seconds=0.01, idle_gap_s=0.5))  # never watched
    assert (depth.target, depth.num_late) == (2, 0)


def test_a_run_of_plans_in_time_takes_one_step_back_and_a_late_one_returns_it():
    depth = PipelineDepth(ceiling=4)
    answer(depth, 1, 0.002)
    answer(depth, 2, 0.002)
    assert depth.target == 4
    for step_id in range(3, 3 + CALM_PLANS - 1):
        answer(depth, step_id, 0.0)
    assert depth.target == 4
    answer(depth, 3 + CALM_PLANS, 0.0)
    assert depth.target == 3
    answer(depth, 4 + CALM_PLANS, 0.002)
    assert depth.target == 4
    for step_id in range(10_000, 10_000 + 3 * CALM_PLANS):
        answer(depth, step_id, 0.0)
    assert depth.target == FLOOR  # never below plan N + 1 while N runs


def test_a_ceiling_at_or_below_the_floor_is_the_depth():
    for ceiling in (1, 2):
        depth = PipelineDepth(ceiling=ceiling)
        answer(depth, 1, 0.002)
        assert depth.target == ceiling


def test_a_reset_forgets_the_plans_in_flight():
    depth = PipelineDepth(ceiling=4)
    depth.sent(1, 1)
    depth.reset()
    depth.answered(StepResult(1, step_seconds=0.01, idle_gap_s=0.002))  # a new stream's step 1
    assert depth.target == 2
