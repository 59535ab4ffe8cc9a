"""The scheduler's view of one executor: its queue, its running batch, its steps in flight."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field

from radixmesh.executor_info import ExecutorInfo
from radixmesh.sampling import Priority
from radixmesh.step import DeviceHealth, StepPlan, StepResult
from services.scheduler.core.config import SPECULATING_MAX_STEPS_IN_FLIGHT, SchedulerConfig
from services.scheduler.core.draft_offers import DraftOffers, offers_drafts
from services.scheduler.core.pipeline_depth import PipelineDepth
from services.scheduler.core.ports import ExecutorPort
from services.scheduler.core.queue import WaitQueue
from services.scheduler.core.request import Request


@dataclass(frozen=True, slots=True)
class ExecutorLoad:
    """What GetLoad and the metrics report about one executor."""

    executor_id: str
    model: str
    num_running: int
    num_waiting: int
    kv_usage: float
    """Fraction of the executor's pages leased by this scheduler."""
    healthy: bool
    num_preparing: int = 0
    """Constrained requests waiting for their grammar before they join the queue."""
    steps_in_flight_target: int = 2
    """Steps kept in flight to the executor (pipeline_depth.py)."""


@dataclass(slots=True)
class ExecutorState:
    port: ExecutorPort
    info: ExecutorInfo
    queue: WaitQueue
    depth: PipelineDepth
    """How many steps to keep in flight: the next plan goes out below `depth.target`."""
    running: dict[str, Request] = field(default_factory=dict)
    """Requests holding a lease on this executor, in admission order."""
    preparing: dict[str, Request] = field(default_factory=dict)
    """Routed here, their constraint compiling on this executor; queued when it is done."""
    num_in_flight: int = 0
    """Steps submitted and not yet answered (a multi-step plan's each; abort-only plans
    are not counted)."""
    abort_plan_step_id: int = 0
    """Step id of the abort-only plan in flight (sent while a multi-step plan runs); 0: none."""
    next_step_id: int = 1
    num_steps_sent: int = 0
    """Steps submitted (a multi-step plan's each; abort-only plans are not steps)."""
    num_steps_answered: int = 0
    """Of them, the steps whose result was read (a multi-step plan's k results share its
    step id, so step ids do not tell how many of its steps are still in flight)."""
    drafts: DraftOffers = field(default_factory=DraftOffers)
    """Which steps a speculating executor's decodes are offered drafts in, by its switch's
    answers (`StepResult.undrafted_steps`): between them none, several steps a plan."""
    dropped_req_ids: list[str] = field(default_factory=list)
    """Sequences the executor holds that the next plan tells it to forget."""
    abort_req_ids: set[str] = field(default_factory=set)
    """Aborts asked for, applied by the executor's loop at its next turn."""
    alive: bool = True
    reset_reason: str | None = None
    lost_reason: str | None = None
    """Set by `SchedulerCore.executor_lost`: the loop fails the executor at its next turn."""
    """Set by `SchedulerCore.cache_lost`: the loop drops every leased request at its next turn."""
    health: DeviceHealth | None = None
    """The device health of the newest step result that carried one (see `note_health`)."""
    health_time: float = 0.0
    """Scheduler clock when `health` arrived."""
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when work arrives (submit, abort) so an idle loop plans again."""

    @classmethod
    def create(cls, port: ExecutorPort, config: SchedulerConfig) -> ExecutorState:
        queue = WaitQueue(config, port.info.page_size, port.info.max_model_len)
        depth = PipelineDepth(config.max_steps_in_flight)
        return cls(port=port, info=port.info, queue=queue, depth=depth)

    @property
    def steps_target(self) -> int:
        """Steps in flight below which the next plan goes out: the depth's target, and at
        most SPECULATING_MAX_STEPS_IN_FLIGHT where the next plan may offer drafts (a
        speculating executor within its batch cap whose switch has not declined the next
        step). While the switch declines, plans offer none and run several steps each, as
        without speculation, at the depth the round trip needs: capped there too, a
        speculating executor's declined stretches kept the depth of 2 that cost the 1B
        shape's Step stream 13% against 4 at batch 64 (bench/RESULTS.md, 12-07)."""
        target = self.depth.target
        if (
            target > SPECULATING_MAX_STEPS_IN_FLIGHT
            and self.running
            and self.offers_drafts_at(len(self.running))
        ):
            return SPECULATING_MAX_STEPS_IN_FLIGHT
        return target

    def speculates_at(self, num_decodes: int) -> bool:
        """The executor speculates, and at this batch size its decodes may verify drafts."""
        info = self.info
        return bool(info.max_draft_tokens) and num_decodes <= info.max_speculative_batch_size

    def offers_drafts_at(self, num_decodes: int) -> bool:
        """The next plan's `num_decodes` decodes may be offered drafts: the executor
        speculates at that size and its switch has not declined the next step
        (draft_offers.py)."""
        return self.speculates_at(num_decodes) and self.drafts.undrafted_ahead() == 0

    def note_sent(self, plan: StepPlan) -> None:
        """Changes state: `plan` went out (an abort-only plan is no step: its result is
        matched by its id)."""
        if plan.abort_req_ids:
            self.abort_plan_step_id = plan.step_id
            return
        self.depth.sent(plan.step_id, self.num_in_flight)
        self.num_in_flight += plan.num_steps
        self.num_steps_sent += plan.num_steps
        self.drafts.planned(plan.num_steps, offers_drafts(plan))

    def note_answered(self, result: StepResult) -> None:
        """Changes state: the result of the oldest step in flight came (or the abort-only
        plan's)."""
        if result.step_id == self.abort_plan_step_id:
            self.abort_plan_step_id = 0
            return
        self.num_in_flight -= 1
        self.num_steps_answered += 1
        self.drafts.answered(result.undrafted_steps)
        self.depth.answered(result)

    def forget_in_flight(self) -> None:
        """Changes state: the executor failed; nothing sent to it will be answered."""
        self.num_in_flight = self.abort_plan_step_id = 0
        self.num_steps_answered = self.num_steps_sent
        self.drafts = DraftOffers()
        self.depth.reset()

    def note_health(self, health: DeviceHealth | None, now: float) -> None:
        """Keep a step result's device health (results between reports carry none)."""
        if health is not None:
            self.health, self.health_time = health, now

    @property
    def executor_id(self) -> str:
        return self.info.executor_id

    @property
    def page_size(self) -> int:
        return self.info.page_size

    @property
    def has_work(self) -> bool:
        return bool(self.running or len(self.queue) or self.dropped_req_ids)

    def load(self, num_held_pages: int = 0) -> ExecutorLoad:
        """`num_held_pages`: pages locked by context holds, which count as used."""
        num_leased = num_held_pages + sum(len(r.page_table) for r in self.running.values())
        return ExecutorLoad(
            executor_id=self.executor_id,
            model=self.info.model,
            num_running=len(self.running),
            num_waiting=len(self.queue),
            kv_usage=min(1.0, num_leased / max(1, self.info.num_pages)),
            healthy=self.alive,
            num_preparing=len(self.preparing),
            steps_in_flight_target=self.steps_target,
        )


def running_by_priority(executors: Iterable[ExecutorState]) -> dict[Priority, int]:
    """Read-only: the requests running on these executors, per class."""
    counts = dict.fromkeys(Priority, 0)
    for ex in executors:
        for req in ex.running.values():
            counts[req.priority] += 1
    return counts


def waiting_by_priority(executors: Iterable[ExecutorState]) -> dict[Priority, int]:
    """Read-only: the requests queued for these executors, per class."""
    counts = dict.fromkeys(Priority, 0)
    for ex in executors:
        for priority, n in ex.queue.count_by_priority().items():
            counts[priority] += n
    return counts
