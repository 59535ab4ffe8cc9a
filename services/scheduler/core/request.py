"""A request as the scheduler sees it, and the updates it streams back."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from radixmesh.sampling import Constraint, Priority, SamplingParams
from radixmesh.speculation import SpecUsage
from radixmesh.step import TokenLogprobs
from radixmesh.updates import RequestUpdate


class RequestStatus(enum.Enum):
    PREPARING = "preparing"
    """Its constraint compiles on the executor it is routed to; queued once that is done."""
    WAITING = "waiting"
    """In a queue: new, or preempted and waiting to resume."""
    RUNNING = "running"
    """Holds a lease and is part of the executor's batch."""
    FINISHED = "finished"


@dataclass(frozen=True, slots=True)
class StepShare:
    """A request's prefix computed by another request of its group in the same step."""

    leader: Request
    num_tokens: int
    """Tokens of the prefix (whole pages) the leader computes for it."""


@dataclass(slots=True)
class Request:
    req_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    arrival_time: float
    """Scheduler clock (monotonic seconds) at submit."""
    constraint: Constraint | None = None
    model: str = ""
    priority: Priority = Priority.INTERACTIVE
    deadline: float | None = None
    """Scheduler clock time after which the request ends with DeadlineExceeded."""
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    """Filled by the scheduler from step results."""
    executor_id: str | None = None
    """Set by routing."""
    match_tokens: int = 0
    """Cached prefix length seen by routing (a queue ranking hint, may go stale)."""
    work: int = 0
    """`queue.request_work` on its executor, kept by the first `WaitQueue.work` (0: not
    yet): the queue-wait estimate reads it per push, remove and finish, and for the
    running batch once a step."""
    final_pages: int = 0
    """`queue.final_pages` on its executor, kept by the first `WaitQueue.pages` (0: not
    yet), read as often as `work`."""
    num_routed_shared_tokens: int = 0
    """Prompt tokens routing found cached, queued or prefilling on its executor: work the
    queued request does not add to that executor's load (routing.load_tokens)."""
    num_cached_tokens: int | None = None
    """Tokens served from the cache at first admission (reported once)."""
    lease_id: str | None = None
    page_table: list[int] = field(default_factory=list)
    """Pages of the lease: cached prefix first, then leased pages."""
    num_unsent_pages: int = 0
    """Tail pages of page_table the executor has not been sent yet."""
    num_computed_tokens: int = 0
    """KV positions computed once every submitted step has run (optimistic)."""
    num_admitted_tokens: int = 0
    """Tokens sent in full at admission (prompt + outputs so far); prefill runs to here."""
    on_executor: bool = False
    """The executor holds state for it (sent as a new sequence, not yet dropped)."""
    hold_until_answered: int = 0
    """Set by a preemption: not re-admitted before the executor has answered this many
    steps (`ExecutorState.num_steps_answered`): the steps in flight as it was preempted,
    every step of a multi-step plan included, may still carry its tokens."""
    inflight_page_keys: list[int] = field(default_factory=list)
    """Keys of the prompt pages this request computes that are not in the tree yet."""
    page_keys: list[int] = field(default_factory=list)
    """Hash chain over the full pages of all_token_ids (see sharing.page_keys)."""
    followers: dict[str, int] = field(default_factory=dict)
    """Waiting requests deferred until this one's prefix reaches the tree, with the
    tokens of it they share."""
    reported: bool = False
    """The first update (with prompt and cached token counts) went out."""
    prepared_on: str | None = None
    """Executor whose grammar cache holds the constraint (set once preparation succeeded)."""
    queued_time: float | None = None
    """Scheduler clock when it first joined a queue (after constraint preparation)."""
    first_scheduled_time: float | None = None
    """Scheduler clock of its first admission into a batch (for the queue time metric)."""
    last_token_time: float | None = None
    """Scheduler clock of the step result that carried its latest output token."""
    group_id: str | None = None
    """Program group (the choices of one select, the branches of one fork): admitted
    together, never partly preempted by unrelated work (see groups.py)."""
    group_size: int = 0
    """How many requests the group has in all, when its sender said (a select's
    choices); 0: not said. The largest any member says counts (see groups.py)."""
    group_arrival_time: float = 0.0
    """Arrival of the group's first member (its own arrival when it has no group); set at
    submit, so a group's members sort together as preemption victims."""
    step_share: StepShare | None = None
    """Set by admission when this request takes pages another request of its group
    computes in the same step (see groups.py); cleared once its first result is read."""
    hold_id: str | None = None
    """On a normal finish, keep the committed context locked under this hold (see
    `SchedulerCore.submit`); cleared when the hold is released before the request ends."""
    trace: Any = None
    """Set by the servicer when the request is traced (services/scheduler/tracing.py's
    RequestTrace); the core notes its events on it, guarded by `if req.trace`."""
    prompt_logprobs: list[TokenLogprobs] = field(default_factory=list)
    """With sampling.prompt_logprobs_start: the prompt positions' log probabilities from
    step results so far, in position order (reported on the first update)."""
    spec: SpecUsage = field(default_factory=SpecUsage)
    """Speculative decoding counters summed from step results (reported on the last
    update when the request verified any draft)."""

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def prefilling(self) -> bool:
        return self.num_computed_tokens < self.num_admitted_tokens

    @property
    def num_wanted_prompt_logprobs(self) -> int:
        """Prompt positions to score: those from sampling.prompt_logprobs_start on."""
        start = self.sampling.prompt_logprobs_start
        return 0 if start is None else max(0, len(self.prompt_token_ids) - start)

    @property
    def max_cached_tokens(self) -> int | None:
        """The most prompt tokens the prefix cache may serve: while prompt positions are
        still to be scored, the logits from position prompt_logprobs_start - 1 on must be
        computed. None: no cap."""
        start = self.sampling.prompt_logprobs_start
        if start is None or len(self.prompt_logprobs) >= self.num_wanted_prompt_logprobs:
            return None
        return start - 1

    @property
    def num_expected_tokens(self) -> int:
        """Sequence length once every submitted step ran (computed + the unfed sample)."""
        return self.num_computed_tokens + 1


@dataclass(slots=True)
class StepUpdates:
    """Every request's updates from one scheduler step, delivered together."""

    step_id: int
    updates: list[RequestUpdate] = field(default_factory=list)
