"""Checks a step plan against the executor's limits and held sequences before anything changes."""

from __future__ import annotations

from dataclasses import dataclass

from radixmesh.errors import InvalidArgument, ResourceExhausted
from radixmesh.step import NewSequence, RunningSequence, StepPlan, check_multi_step
from services.executor.core.sequence import SequenceState


@dataclass(frozen=True, slots=True)
class PlanLimits:
    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    vocab_size: int
    page_size: int
    num_pages: int
    has_grammar: bool


def validate_plan(plan: StepPlan, seqs: dict[str, SequenceState], limits: PlanLimits) -> None:
    """Raises InvalidArgument / ResourceExhausted naming the field; changes nothing.

    Running sequences are checked against their planned state (num_known_tokens
    counts the tokens steps prepared before this one will sample).
    """
    check_multi_step(plan)
    if plan.num_scheduled_tokens > limits.max_num_batched_tokens:
        raise ResourceExhausted(
            f"plan {plan.step_id}: {plan.num_scheduled_tokens} scheduled tokens exceed "
            f"max_num_batched_tokens ({limits.max_num_batched_tokens})"
        )
    if len(seqs) + len(plan.new_seqs) > limits.max_num_seqs:
        raise ResourceExhausted(
            f"plan {plan.step_id}: {len(seqs)} held + {len(plan.new_seqs)} new "
            f"sequences exceed max_num_seqs ({limits.max_num_seqs})"
        )
    seen: set[str] = set()
    for new in plan.new_seqs:
        if new.req_id in seqs or new.req_id in seen:
            raise InvalidArgument(f"new_seqs: req_id {new.req_id!r} is already running")
        seen.add(new.req_id)
        _check_new(new, limits)
    page_size = limits.page_size
    for running in plan.running_seqs:  # each row's checks inline; a helper names a failure
        seq = seqs.get(running.req_id)
        if seq is None:
            continue
        num_scheduled, appended = running.num_scheduled_tokens, running.appended_page_ids
        end = seq.num_computed_tokens + num_scheduled
        num_pages = seq.num_pages + len(appended)
        if num_scheduled < 0 or end > seq.num_known_tokens or num_pages * page_size < end:
            _check_span(
                running.req_id, seq.num_computed_tokens, num_scheduled, seq.num_known_tokens,
                num_pages, limits,
            )  # fmt: skip
        if appended:
            _check_page_ids(running.req_id, appended, limits)
        if plan.num_steps > 1:
            _check_steps(running.req_id, seq, running, plan.num_steps, limits)


def steps_left(seq: SequenceState, max_model_len: int) -> int:
    """Decode steps `seq` can still run by its planned state before max_tokens or the
    context limit ends it (a step adds one output token)."""
    left = max_model_len - seq.num_known_tokens
    max_tokens = seq.sampling.max_tokens
    if max_tokens is not None:
        left = min(left, max_tokens - (seq.num_known_tokens - seq.num_prompt_tokens))
    return left


def _check_steps(
    req_id: str, seq: SequenceState, running: RunningSequence, k: int, limits: PlanLimits
) -> None:
    """A multi-step plan's decode: the pages cover every step the sequence may run."""
    if seq.num_computed_tokens + 1 != seq.num_known_tokens:
        raise InvalidArgument(
            f"running_seqs[{req_id!r}]: a plan of num_steps {k} runs decodes only; this "
            f"sequence has {seq.num_known_tokens - seq.num_computed_tokens} tokens to compute"
        )
    end = seq.num_computed_tokens + min(k, max(1, steps_left(seq, limits.max_model_len)))
    num_pages = seq.num_pages + len(running.appended_page_ids)
    if num_pages * limits.page_size < end:
        raise InvalidArgument(
            f"running_seqs[{req_id!r}].appended_page_ids: {num_pages} pages of "
            f"{limits.page_size} cannot hold the {end} tokens of {k} steps"
        )


def _check_new(new: NewSequence, limits: PlanLimits) -> None:
    where = f"new_seqs[{new.req_id!r}]"
    num_tokens = len(new.token_ids)
    if not 1 <= new.num_prompt_tokens <= num_tokens:
        raise InvalidArgument(
            f"{where}.num_prompt_tokens must be in [1, {num_tokens}], got {new.num_prompt_tokens}"
        )
    if num_tokens >= limits.max_model_len:
        raise InvalidArgument(
            f"{where}.token_ids: {num_tokens} tokens leave no room under max_model_len "
            f"({limits.max_model_len})"
        )
    if new.num_scheduled_tokens < 1:
        raise InvalidArgument(f"{where}.num_scheduled_tokens must be >= 1")
    vocab = limits.vocab_size
    if any(not 0 <= t < vocab for t in new.token_ids):
        raise InvalidArgument(f"{where}.token_ids must be in [0, {vocab})")
    if new.constraint is not None and not limits.has_grammar:
        raise InvalidArgument(f"{where}.constraint: this executor has no grammar backend")
    _check_span(
        where,
        new.num_computed_tokens,
        new.num_scheduled_tokens,
        num_tokens,
        len(new.page_ids),
        limits,
    )
    _check_page_ids(where, new.page_ids, limits)


def _check_span(
    where: str,
    num_computed: int,
    num_scheduled: int,
    num_known: int,
    num_pages: int,
    limits: PlanLimits,
) -> None:
    end = num_computed + num_scheduled
    if num_scheduled < 0 or end > num_known:
        raise InvalidArgument(
            f"{where}: num_computed_tokens ({num_computed}) + num_scheduled_tokens "
            f"({num_scheduled}) exceed the {num_known} known tokens"
        )
    if num_pages * limits.page_size < end:
        raise InvalidArgument(
            f"{where}.page_ids: {num_pages} pages of {limits.page_size} cannot hold {end} tokens"
        )


def _check_page_ids(where: str, page_ids: list[int], limits: PlanLimits) -> None:
    num_pages = limits.num_pages
    if page_ids and any(not 0 <= p < num_pages for p in page_ids):
        raise InvalidArgument(f"{where}.page_ids must be in [0, {num_pages})")


def next_decodes(plan: StepPlan, seqs: dict[str, SequenceState], max_model_len: int) -> StepPlan:
    """The next step of a multi-step plan: a decode of each of its sequences still
    running (the plan's check made their pages cover every step they may run)."""
    running = []
    for r in plan.running_seqs:
        seq = seqs.get(r.req_id)
        if seq is not None and not seq.stopped and steps_left(seq, max_model_len) > 0:
            running.append(RunningSequence(r.req_id, 1))
    return StepPlan(plan.step_id, running_seqs=running)
