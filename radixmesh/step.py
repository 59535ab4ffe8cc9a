"""The step contract between the scheduler and an executor, as plain data.

Mirrors `executor.proto`: a plan carries new sequences in full once, running
sequences as diffs, and the ids to forget; a multi-step decode plan asks for
several decode steps at once, answered by one result per step. The in-process engine passes these
objects directly; the services convert them to and from protobuf at the edge.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from radixmesh.cache_types import PageCopy
from radixmesh.columns import interleave
from radixmesh.errors import InvalidArgument
from radixmesh.sampling import Constraint, SamplingParams


@dataclass(slots=True)
class NewSequence:
    req_id: str
    token_ids: list[int]
    """Every token known so far: prompt, then earlier outputs on resume."""
    num_prompt_tokens: int
    num_computed_tokens: int
    """Tokens whose KV is already in the pages (the cached prefix)."""
    num_scheduled_tokens: int
    """Tokens to run this step, from num_computed_tokens on."""
    page_ids: list[int]
    sampling: SamplingParams
    constraint: Constraint | None = None
    traceparent: str = ""
    """W3C traceparent of the request's span when it is traced (the executor links its
    step spans to it); "" otherwise."""
    page_copy: PageCopy | None = None
    """Copy the KV of a partial page's first slots into the page holding
    num_computed_tokens (which ends right after them), in each layer of this step after its
    KV writes and before its attention: the source is a partial page the cache kept (the
    lease granted the copy) or a page another sequence of this step computes (a group's
    leader). None: nothing to copy."""


@dataclass(slots=True)
class RunningSequence:
    req_id: str
    num_scheduled_tokens: int
    """Next prompt tokens while prefilling, else 1 (decode the last sampled token)."""
    appended_page_ids: list[int] = field(default_factory=list)
    num_draft_tokens: int = 0
    """A decode only: at most this many draft tokens the executor may verify after the
    decoded token in this step (speculative decoding); the pages cover the sequence's
    known tokens plus these. The executor proposes the draft and may verify fewer."""


@dataclass(slots=True)
class StepPlan:
    step_id: int
    new_seqs: list[NewSequence] = field(default_factory=list)
    running_seqs: list[RunningSequence] = field(default_factory=list)
    finished_req_ids: list[str] = field(default_factory=list)
    """Sequences to forget before this step runs."""
    num_steps: int = 1
    """Multi-step decode plan: decode steps the executor runs back to back (see
    `check_multi_step`); it answers with one result per step (`StepResult.substep`)."""
    abort_req_ids: list[str] = field(default_factory=list)
    """Sequences ended (aborted, past their deadline) keeping at most the KV of the tokens
    already reported: stopped at the executor's next step, also inside a multi-step plan
    still running when this plan arrives, then forgotten before this plan runs, as
    finished_req_ids."""

    @property
    def num_scheduled_tokens(self) -> int:
        return sum(s.num_scheduled_tokens for s in self.new_seqs) + sum(
            s.num_scheduled_tokens for s in self.running_seqs
        )


MAX_STEPS_PER_PLAN = 64
"""Most decode steps one plan may ask for."""


def check_multi_step(plan: StepPlan) -> None:
    """Raises InvalidArgument unless `plan` is a valid multi-step shape (or one step).

    A plan of num_steps k > 1 admits nothing and prefills nothing: every running
    sequence decodes one token per step with no draft tokens. Each sequence's pages
    must cover its k tokens, or as many as its max_tokens and the context limit
    leave (the executor checks that against its own state).
    """
    k = plan.num_steps
    if not 1 <= k <= MAX_STEPS_PER_PLAN:
        raise InvalidArgument(f"num_steps must be in [1, {MAX_STEPS_PER_PLAN}], got {k}")
    if k == 1:
        return
    if plan.new_seqs:
        raise InvalidArgument(f"plan {plan.step_id}: a plan of num_steps {k} has no new_seqs")
    for seq in plan.running_seqs:
        if seq.num_scheduled_tokens != 1 or seq.num_draft_tokens:
            raise InvalidArgument(
                f"running_seqs[{seq.req_id!r}]: a plan of num_steps {k} decodes one token "
                f"per step with no draft, got num_scheduled_tokens "
                f"{seq.num_scheduled_tokens} and num_draft_tokens {seq.num_draft_tokens}"
            )


@dataclass(slots=True)
class TokenLogprobs:
    """Log probabilities at one generated position."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)
    """(token_id, logprob), most likely first."""


@dataclass(slots=True)
class SequenceOutput:
    req_id: str
    token_id: int | None
    """None when the step ended inside the known tokens (a non-final prefill chunk)."""
    logprobs: TokenLogprobs | None = None
    finish_reason: str | None = None
    """"stop" or "length" when the executor ended the sequence."""
    matched_stop_token_id: int | None = None
    prompt_logprobs: list[TokenLogprobs] = field(default_factory=list)
    """With sampling.prompt_logprobs_start: the prompt tokens' log probabilities this step
    computed, for positions prompt_logprobs_position, +1, ... (token_id is the prompt token)."""
    prompt_logprobs_position: int = 0
    accepted_token_ids: list[int] = field(default_factory=list)
    """Speculative decoding: draft tokens the step verified and kept; they come before
    token_id in the output (the step produced len(accepted_token_ids) + 1 tokens and
    computed KV for as many positions)."""
    num_draft_tokens: int = 0
    """Draft tokens the step verified for this sequence (0: no draft)."""
    num_forced_tokens: int = 0
    """Jump-forward: the leading draft tokens the sequence's constraint forced (the only
    token its mask allowed), of those kept in accepted_token_ids."""


@dataclass(frozen=True, slots=True)
class DeviceHealth:
    """What the executor's GPU reports (NVML); a field is None when the device cannot say."""

    utilization_ratio: float | None = None
    """Fraction of the last sample period the GPU was busy, [0, 1]."""
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    temperature_celsius: float | None = None


@dataclass(slots=True)
class StepResult:
    step_id: int
    outputs: list[SequenceOutput] = field(default_factory=list)
    step_seconds: float = 0.0
    health: DeviceHealth | None = None
    """Set by the executor service at most about once a second; None on CPU and in between."""
    substep: int = 0
    """Which step of its plan this is, from 0 (a plan of num_steps k answers k results)."""
    undrafted_steps: int = 0
    """A speculating executor after a step: 0 when its switch would draft the batch's next
    decode step; else D, the D-th decode step from this one being the first it may draft
    (a probe), the D - 1 before it declined whatever they are offered. The scheduler plans
    those without drafts, several a plan (scheduler/core/draft_offers.py)."""
    idle_gap_s: float = 0.0
    """A plan's first step: how long the executor's step thread had had no step of the
    stream to run when the plan arrived (0: it came while a step before it was queued or
    running). The scheduler deepens its pipeline on such gaps (pipeline_depth.py)."""
    plain_req_ids: list[str] = field(default_factory=list)
    """Columnar rows (as `wire.result_from_proto(msg, columnar=True)` gives them): sequence
    plain_req_ids[i] sampled plain_token_ids[i] and nothing else (`is_plain`); `outputs`
    then holds the step's other rows. Empty: every row is in `outputs`."""
    plain_token_ids: list[int] = field(default_factory=list)
    output_rows: list[int] = field(default_factory=list)
    """With plain rows: the row of each of `outputs` among all the step's rows (increasing);
    the plain rows fill the others in order."""

    @property
    def num_rows(self) -> int:
        return len(self.outputs) + len(self.plain_req_ids)

    def rows(self) -> list[SequenceOutput]:
        """Every row of the step in order, a plain row as a SequenceOutput of its token."""
        if not self.plain_req_ids:
            return list(self.outputs)
        plain = map(SequenceOutput, self.plain_req_ids, self.plain_token_ids)
        return interleave(plain, self.outputs, self.output_rows)


def is_plain(out: SequenceOutput) -> bool:
    """out is one sampled token and nothing else: no log probabilities, finish, drafts or
    prompt log probabilities (a decode's usual row; the wire sends such rows columnar)."""
    return (
        out.token_id is not None
        and out.finish_reason is None
        and out.matched_stop_token_id is None
        and out.logprobs is None
        and not out.num_draft_tokens
        and not out.accepted_token_ids
        and not out.prompt_logprobs
    )
