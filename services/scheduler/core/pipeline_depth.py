"""How many steps the scheduler keeps in flight to one executor: as few as keep it busy.

The next plan goes out once fewer than `target` steps are in flight (a multi-step
plan counts each of its steps). It must reach the executor before those steps
end: the round trip (the executor's result on the stream, the scheduler's
processing and planning, the plan back) has `target - 1` steps' time. Where a
step is short against that trip (a small model at a large batch), the
executor's step thread runs out of work and says so: each step result carries
the gap before its plan arrived (`StepResult.idle_gap_s`, measured by the
executor's pipeline). A gap on a plan the scheduler sent while steps were
still in flight (so meant to arrive in time) makes the plan late, and the
target grows by one, up to `ceiling` (`SchedulerConfig.max_steps_in_flight`).

A deeper target costs a request arriving meanwhile one more step before it is
admitted, so the target comes back down: after `CALM_PLANS` plans in a row sent in
flight and none late, it drops by one (to `FLOOR` at least), and a late plan raises
it again. In steady state at a depth that is needed, that probe costs one late plan
in `CALM_PLANS`. Plans sent while nothing was in flight (the executor idle because
the scheduler had nothing for it) and gaps shorter than `LATE_SHARE` of a step
(a thread hand-over) say nothing of the depth.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from radixmesh.step import StepResult

FLOOR = 2
"""Plan N + 1 while step N runs: the least that overlaps the round trip at all."""
CALM_PLANS = 64
"""Plans in a row that came in time before the target tries one step less."""
LATE_SHARE = 0.1
"""A gap counts when longer than this share of the step it delayed."""


@dataclass(slots=True)
class PipelineDepth:
    ceiling: int
    """The most steps in flight (`max_steps_in_flight`; a speculating executor's cap)."""
    target: int = field(init=False)
    """Steps in flight below which the next plan goes out."""
    num_late: int = 0
    """Plans sent in flight that reached the executor after its steps had run out."""
    _watched: set[int] = field(default_factory=set)
    """Step ids of plans sent while steps were in flight, until their first result."""
    _calm: int = 0

    def __post_init__(self) -> None:
        self.target = min(FLOOR, self.ceiling)

    def sent(self, step_id: int, num_in_flight: int) -> None:
        """A plan of steps went out with `num_in_flight` steps before it not yet answered."""
        if num_in_flight and self.ceiling > FLOOR:
            self._watched.add(step_id)

    def answered(self, result: StepResult) -> None:
        """A step's result: its plan's first step tells whether the plan came late."""
        if result.substep or result.step_id not in self._watched:
            return
        self._watched.discard(result.step_id)
        if result.idle_gap_s > LATE_SHARE * result.step_seconds:
            self.num_late += 1
            self._calm = 0
            self.target = min(self.target + 1, self.ceiling)
            return
        self._calm += 1
        if self._calm >= CALM_PLANS and self.target > FLOOR:
            self._calm = 0
            self.target -= 1

    def reset(self) -> None:
        """The executor's stream ended: no plan in flight is watched any more."""
        self._watched.clear()
