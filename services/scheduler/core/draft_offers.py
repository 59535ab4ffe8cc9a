"""Which of a speculating executor's steps are offered drafts: its switch's answers, kept
by step number.

After each step a speculating executor says whether its switch would draft the batch's
next decode step (`StepResult.undrafted_steps` 0) or declines: D > 0 says that the D - 1
decode steps after that one decline whatever they are offered and that the D-th is the
first that may draft (the switch's probe, or the step after the few plain ones it times).
Results arrive some steps late (those in flight), so the answer is kept by step number:
every step planned is numbered, each of a multi-step plan's, and a result's number is the
count of steps answered. The steps before the one that may draft are offered none, and
run several a plan (multi_step.py); it is offered drafts; those planned after it before
its own result came are offered none either, since a probe that finds nothing keeps the
decline and one that finds drafts says so one step later. Answered only by steps before
it, a result in flight during the probe said "the next step may draft", and the plans
after the probe offered drafts, one step each, their prepares waiting on the step before
(bench/RESULTS.md).

A step offered drafts may emit up to 1 + k tokens, so until it is answered every plan's
pages cover k more tokens per such step in flight (`num_offered_in_flight`); a step
offered none emits one, which its plan counted.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from radixmesh.step import StepPlan

UNBOUNDED = 1 << 30
"""`undrafted_ahead` while the step that may draft is in flight: no step planned before
its answer is offered drafts."""


@dataclass(slots=True)
class DraftOffers:
    num_planned: int = 0
    """Steps planned (each of a multi-step plan's; abort-only plans are not steps)."""
    num_answered: int = 0
    first_drafting: int | None = None
    """Number of the first step the executor's switch may draft; None: it drafts now."""
    offered: deque[int] = field(default_factory=deque)
    """Numbers of the steps in flight that were offered drafts, oldest first."""

    def planned(self, num_steps: int, offered: bool) -> None:
        """A plan of `num_steps` steps went out; `offered`: some decode of it may verify a
        draft (then it is a plan of one step)."""
        if offered:
            self.offered.append(self.num_planned + 1)
        self.num_planned += num_steps

    def answered(self, undrafted_steps: int) -> None:
        """The next step's result came, saying `StepResult.undrafted_steps`."""
        self.num_answered += 1
        while self.offered and self.offered[0] <= self.num_answered:
            self.offered.popleft()
        self.first_drafting = self.num_answered + undrafted_steps if undrafted_steps else None

    def undrafted_ahead(self) -> int:
        """How many steps from the next one planned are offered no drafts (0: the next is
        offered them; UNBOUNDED while the step that may draft is in flight)."""
        first = self.first_drafting
        if first is None:
            return 0
        next_step = self.num_planned + 1
        if next_step < first:
            return first - next_step
        if self.offered and self.offered[-1] >= first:
            return UNBOUNDED  # offered, in flight: its answer says what follows
        return 0  # due, and planned without drafts (a step the switch did not count): now

    @property
    def num_offered_in_flight(self) -> int:
        return len(self.offered)


def offers_drafts(plan: StepPlan) -> bool:
    """Whether some decode of the plan may verify a draft (the proposer's or a forced run)."""
    return any(running.num_draft_tokens for running in plan.running_seqs)
