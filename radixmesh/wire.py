"""Protobuf <-> the contract's dataclasses: one converter per concept, for every room.

Sampling, constraints and priority (`radixmesh.sampling`), the step plan and
result (`radixmesh.step`), the scheduler's request updates (`radixmesh.updates`)
and executor information (`radixmesh.executor_info`). Both ends of each stream
use the same functions, so they can never disagree on the wire format.

Sampling, constraints and priority are converted in `radixmesh.wire_params`
and given here with the rest.

On the hot path: every plan is converted once on its way in and every result
once on its way out. So the converters read set fields with `ListFields()`
(one call, presence included) instead of a `HasField` per field, copy repeated
fields by slicing, and build result messages in place with `add()`.
"""

from __future__ import annotations

import itertools
from dataclasses import fields
from typing import Any

from radixmesh.cache_types import PageCopy
from radixmesh.columns import check_rows, interleave
from radixmesh.errors import InvalidArgument, error_for_code
from radixmesh.executor_info import ExecutorInfo
from radixmesh.speculation import SpecUsage
from radixmesh.status import status_of, status_of_number
from radixmesh.step import (
    DeviceHealth,
    NewSequence,
    RunningSequence,
    SequenceOutput,
    StepPlan,
    StepResult,
    TokenLogprobs,
    is_plain,
)
from radixmesh.updates import RequestUpdate
from radixmesh.v1 import cache_pb2, executor_pb2, inference_pb2, scheduler_pb2
from radixmesh.wire_params import (
    DEFAULT_SAMPLING,
    constraint_from_proto,
    constraint_to_proto,
    priority_from_proto,
    priority_to_proto,
    read_float32,
    sampling_from_proto,
    sampling_to_proto,
)

__all__ = [
    "constraint_from_proto",
    "constraint_to_proto",
    "health_from_proto",
    "health_to_proto",
    "info_from_proto",
    "info_to_proto",
    "logprobs_from_proto",
    "logprobs_to_proto",
    "plan_from_proto",
    "plan_to_proto",
    "priority_from_proto",
    "priority_to_proto",
    "read_float32",
    "result_from_proto",
    "result_to_proto",
    "results_from_proto",
    "sampling_from_proto",
    "sampling_to_proto",
    "speculation_from_proto",
    "speculation_to_proto",
    "update_from_proto",
    "update_to_proto",
]

_HEALTH_FIELDS = tuple(f.name for f in fields(DeviceHealth))
_INFO_FIELDS = tuple(f.name for f in fields(ExecutorInfo))
_OPTIONAL_INFO_FIELDS = ("vocab_size", "max_num_seqs", "max_num_batched_tokens")
_OPTIONAL_UPDATE_FIELDS = ("finish_reason", "matched_stop_token_id")


# -- plans --------------------------------------------------------------------


def page_copy_to_proto(copy: PageCopy) -> cache_pb2.PageCopy:
    return cache_pb2.PageCopy(
        src_page_id=copy.src_page_id, dst_page_id=copy.dst_page_id, num_tokens=copy.num_tokens
    )


def page_copy_from_proto(msg: cache_pb2.PageCopy) -> PageCopy:
    """The copy as sent; its bounds are checked where it runs (the executor)."""
    return PageCopy(msg.src_page_id, msg.dst_page_id, msg.num_tokens)


def _new_seq_from_proto(msg: executor_pb2.NewSequence) -> NewSequence:
    req_id = msg.req_id
    if not req_id:
        raise InvalidArgument("new_seqs.req_id must not be empty")
    where = f"new_seqs[{req_id!r}]."
    constraint = (
        constraint_from_proto(msg.constraint, where) if msg.HasField("constraint") else None
    )
    return NewSequence(
        req_id=req_id,
        token_ids=msg.token_ids[:],  # a list; slicing is the repeated field's fastest copy
        num_prompt_tokens=msg.num_prompt_tokens,
        num_computed_tokens=msg.num_computed_tokens,
        num_scheduled_tokens=msg.num_scheduled_tokens,
        page_ids=msg.page_ids[:],
        sampling=sampling_from_proto(msg.sampling, where),
        constraint=constraint,
        traceparent=msg.traceparent,
        page_copy=page_copy_from_proto(msg.page_copy) if msg.HasField("page_copy") else None,
    )


def plan_from_proto(msg: executor_pb2.StepPlan) -> StepPlan:
    """A plan as the core takes it, its running rows in order (the plain ones read from
    the columns); empty req_ids, bad sampling and columns that disagree raise
    InvalidArgument."""
    running = [
        RunningSequence(
            seq.req_id, seq.num_scheduled_tokens, seq.appended_page_ids[:], seq.num_draft_tokens
        )
        for seq in msg.running_seqs
    ]
    plain_ids = msg.decode_req_ids[:]
    if not (all(plain_ids) and all(seq.req_id for seq in running)):
        raise InvalidArgument("running_seqs.req_id must not be empty")
    if plain_ids or msg.running_rows:
        running = _merge_running(msg.step_id, plain_ids, running, msg.running_rows[:])
    return StepPlan(
        step_id=msg.step_id,
        new_seqs=[_new_seq_from_proto(seq) for seq in msg.new_seqs],
        running_seqs=running,
        finished_req_ids=list(msg.finished_req_ids),
        num_steps=msg.num_steps or 1,
        abort_req_ids=list(msg.abort_req_ids),
    )


def _merge_running(
    step_id: int, plain_ids: list[str], others: list[RunningSequence], rows: list[int]
) -> list[RunningSequence]:
    """The running rows in order: `others` at their `rows`, the plain decodes in the rest."""
    where = f"plan {step_id}"
    if not plain_ids:
        if rows != list(range(len(others))):
            raise InvalidArgument(f"{where}: running_rows needs decode_req_ids (got {rows})")
        return others
    n = len(plain_ids) + len(others)
    check_rows(
        where, "running_rows", rows, "running_seqs", len(others), f"the plan's {n} running rows", n
    )
    return interleave(map(RunningSequence, plain_ids, itertools.repeat(1)), others, rows)


def plan_to_proto(plan: StepPlan, columnar: bool = True) -> executor_pb2.StepPlan:
    """The plan's plain decode rows (one token, no appended page, no draft) go columnar
    (`decode_req_ids`), the other running rows as RunningSequence messages with their
    rows (`running_rows`). `columnar=False`: every running row a message, in order (the
    layout before the columns)."""
    msg = executor_pb2.StepPlan(
        step_id=plan.step_id,
        finished_req_ids=plan.finished_req_ids,
        num_steps=plan.num_steps if plan.num_steps != 1 else 0,
        abort_req_ids=plan.abort_req_ids,
    )
    for seq in plan.new_seqs:
        new = msg.new_seqs.add(
            req_id=seq.req_id,
            token_ids=seq.token_ids,
            num_prompt_tokens=seq.num_prompt_tokens,
            num_computed_tokens=seq.num_computed_tokens,
            num_scheduled_tokens=seq.num_scheduled_tokens,
            page_ids=seq.page_ids,
            traceparent=seq.traceparent,
        )
        if seq.sampling != DEFAULT_SAMPLING:
            new.sampling.CopyFrom(sampling_to_proto(seq.sampling))
        if seq.constraint is not None:
            new.constraint.CopyFrom(constraint_to_proto(seq.constraint))
        if seq.page_copy is not None:
            new.page_copy.CopyFrom(page_copy_to_proto(seq.page_copy))
    others, rows = plan.running_seqs, []
    if columnar:
        plain_ids: list[str] = []
        others = []
        for row, run in enumerate(plan.running_seqs):
            if (
                run.num_scheduled_tokens == 1
                and not run.appended_page_ids
                and not run.num_draft_tokens
            ):
                plain_ids.append(run.req_id)
            else:
                others.append(run)
                rows.append(row)
        if plain_ids:
            msg.decode_req_ids.extend(plain_ids)
            msg.running_rows.extend(rows)
        else:
            others = plan.running_seqs
    add = msg.running_seqs.add
    for run in others:
        add(
            req_id=run.req_id,
            appended_page_ids=run.appended_page_ids,
            num_scheduled_tokens=run.num_scheduled_tokens,
            num_draft_tokens=run.num_draft_tokens,
        )
    return msg


# -- results ------------------------------------------------------------------


def result_to_proto(result: StepResult, columnar: bool = True) -> executor_pb2.StepResult:
    """The step's plain rows (`is_plain`) go columnar, in their order; the others as
    SequenceOutput messages with their rows (`output_rows`). `columnar=False`: every row
    a SequenceOutput, in order (the layout before the columns)."""
    outputs = result.outputs
    plain_ids, plain_tokens, rows = result.plain_req_ids, result.plain_token_ids, result.output_rows
    if not columnar:
        outputs, plain_ids, plain_tokens, rows = result.rows(), [], [], []
    elif not plain_ids:
        outputs, plain_ids, plain_tokens, rows = [], [], [], []
        for row, output in enumerate(result.outputs):
            token_id = output.token_id
            if token_id is not None and is_plain(output):
                plain_ids.append(output.req_id)
                plain_tokens.append(token_id)
            else:
                outputs.append(output)
                rows.append(row)
        if not plain_ids:
            rows = []
    msg = executor_pb2.StepResult(
        step_id=result.step_id,
        step_seconds=result.step_seconds,
        substep=result.substep,
        undrafted_steps=result.undrafted_steps,
        idle_gap_s=result.idle_gap_s,
        plain_req_ids=plain_ids,
        plain_token_ids=plain_tokens,
        output_rows=rows,
    )
    add = msg.outputs.add
    for output in outputs:
        _output_to_proto(output, add(req_id=output.req_id))
    if result.health is not None:
        health_to_proto(result.health, msg.health)
    return msg


def _output_to_proto(output: SequenceOutput, out: executor_pb2.SequenceOutput) -> None:
    if output.token_id is not None:
        out.token_id = output.token_id
    if output.finish_reason is not None:
        out.finish_reason = output.finish_reason
    if output.matched_stop_token_id is not None:
        out.matched_stop_token_id = output.matched_stop_token_id
    logprobs = output.logprobs
    if logprobs is not None:
        logprobs_to_proto(logprobs, out.logprobs)
    if output.prompt_logprobs:
        out.prompt_logprobs_position = output.prompt_logprobs_position
        add_prompt = out.prompt_logprobs.add
        for entry in output.prompt_logprobs:
            logprobs_to_proto(entry, add_prompt())
    if output.num_draft_tokens:
        out.num_draft_tokens = output.num_draft_tokens
        out.num_forced_tokens = output.num_forced_tokens
        out.accepted_token_ids.extend(output.accepted_token_ids)


def logprobs_to_proto(logprobs: TokenLogprobs, position: inference_pb2.PositionLogprobs) -> None:
    """Fill `position` (e.g. from `repeated.add()`) with one position's log probabilities."""
    position.sampled.token_id = logprobs.token_id
    position.sampled.logprob = logprobs.logprob
    add_top = position.top.add
    for token_id, logprob in logprobs.top:
        add_top(token_id=token_id, logprob=logprob)


def logprobs_from_proto(position: inference_pb2.PositionLogprobs) -> TokenLogprobs:
    return TokenLogprobs(
        position.sampled.token_id,
        position.sampled.logprob,
        [(top.token_id, top.logprob) for top in position.top],
    )


def health_to_proto(health: DeviceHealth, msg: executor_pb2.DeviceHealth) -> None:
    """Fill `msg` with the fields the device reported (the others stay absent)."""
    for name in _HEALTH_FIELDS:
        value = getattr(health, name)
        if value is not None:
            setattr(msg, name, value)


def health_from_proto(msg: executor_pb2.DeviceHealth) -> DeviceHealth:
    return DeviceHealth(**{d.name: value for d, value in msg.ListFields()})


def results_from_proto(msg: executor_pb2.StepResult, columnar: bool = False) -> list[StepResult]:
    """The results one Step stream message carries, in order: its own, then its
    next_results (`result_from_proto` of each). Raises InvalidArgument when one of those
    carries next_results itself."""
    results = [result_from_proto(msg, columnar)]
    for i, more in enumerate(msg.next_results):
        if more.next_results:
            raise InvalidArgument(
                f"step {msg.step_id}: next_results[{i}] carries next_results (one level only)"
            )
        results.append(result_from_proto(more, columnar))
    return results


def result_from_proto(msg: executor_pb2.StepResult, columnar: bool = False) -> StepResult:
    """One step's result (not the message's next_results: `results_from_proto`). The
    step's rows in order: all in `outputs`, or with `columnar` the plain rows as
    the message has them (`StepResult.plain_req_ids`: no object per row; the scheduler's
    reader takes them so). Raises InvalidArgument naming the field when the columns
    disagree (lengths, rows out of order or out of range)."""
    outputs = [_output_from_proto(out) for out in msg.outputs]
    health = health_from_proto(msg.health) if msg.HasField("health") else None
    result = StepResult(msg.step_id, outputs, msg.step_seconds, health, msg.substep)
    result.undrafted_steps = msg.undrafted_steps
    result.idle_gap_s = msg.idle_gap_s
    plain_ids = msg.plain_req_ids
    if not plain_ids:
        rows = list(msg.output_rows)
        if msg.plain_token_ids or (rows and rows != list(range(len(outputs)))):
            raise InvalidArgument(
                f"step {msg.step_id}: plain_token_ids and output_rows need plain_req_ids (got "
                f"{len(msg.plain_token_ids)} plain_token_ids, {len(rows)} output_rows)"
            )
        return result
    result.plain_req_ids = list(plain_ids)
    result.plain_token_ids = list(msg.plain_token_ids)
    result.output_rows = list(msg.output_rows)
    _check_columns(result)
    if not columnar:
        result.outputs = result.rows()
        result.plain_req_ids, result.plain_token_ids, result.output_rows = [], [], []
    return result


def _check_columns(result: StepResult) -> None:
    where = f"step {result.step_id}"
    if len(result.plain_token_ids) != len(result.plain_req_ids):
        raise InvalidArgument(
            f"{where}: plain_token_ids has {len(result.plain_token_ids)} entries, "
            f"plain_req_ids {len(result.plain_req_ids)}"
        )
    n, rows = result.num_rows, result.output_rows
    check_rows(
        where, "output_rows", rows, "outputs", len(result.outputs), f"the step's {n} rows", n
    )


def _output_from_proto(out: executor_pb2.SequenceOutput) -> SequenceOutput:
    logprobs = logprobs_from_proto(out.logprobs) if out.HasField("logprobs") else None
    return SequenceOutput(
        req_id=out.req_id,
        token_id=out.token_id if out.HasField("token_id") else None,
        logprobs=logprobs,
        finish_reason=out.finish_reason or None,
        matched_stop_token_id=(
            out.matched_stop_token_id if out.HasField("matched_stop_token_id") else None
        ),
        prompt_logprobs=[logprobs_from_proto(p) for p in out.prompt_logprobs],
        prompt_logprobs_position=out.prompt_logprobs_position,
        accepted_token_ids=list(out.accepted_token_ids),
        num_draft_tokens=out.num_draft_tokens,
        num_forced_tokens=out.num_forced_tokens,
    )


# -- request updates (Scheduler.Stream) -----------------------------------------


def update_to_proto(
    update: RequestUpdate, req_id: str | None = None, out: scheduler_pb2.TokenUpdate | None = None
) -> scheduler_pb2.TokenUpdate:
    """Fills `out` (e.g. `response.updates.add()`) with update, named req_id (default its own)."""
    msg = out if out is not None else scheduler_pb2.TokenUpdate()
    msg.req_id = update.req_id if req_id is None else req_id
    msg.token_ids.extend(update.token_ids)
    for logprobs in update.logprobs:
        logprobs_to_proto(logprobs, msg.logprobs.add())
    for name in _OPTIONAL_UPDATE_FIELDS:
        value = getattr(update, name)
        if value is not None:
            setattr(msg, name, value)
    if update.num_prompt_tokens is not None:
        msg.num_prompt_tokens = update.num_prompt_tokens
        msg.num_cached_tokens = update.num_cached_tokens or 0
    if update.error is not None:
        msg.error_code = status_of(update.error.code).number
        msg.error_message = str(update.error)
    if update.prompt_logprobs:
        add_prompt = msg.prompt_logprobs.add
        for entry in update.prompt_logprobs:
            logprobs_to_proto(entry, add_prompt())
    if update.speculation is not None:
        speculation_to_proto(update.speculation, msg.speculation)
    return msg


def speculation_to_proto(usage: SpecUsage, msg: inference_pb2.SpeculationUsage) -> None:
    msg.num_drafts = usage.num_drafts
    msg.num_draft_tokens = usage.num_draft_tokens
    msg.num_accepted_tokens = usage.num_accepted_tokens
    msg.accepted_by_position.extend(usage.accepted_by_position)
    msg.num_forced_tokens = usage.num_forced_tokens


def speculation_from_proto(msg: inference_pb2.SpeculationUsage) -> SpecUsage:
    return SpecUsage(
        msg.num_drafts, msg.num_draft_tokens, msg.num_accepted_tokens,
        list(msg.accepted_by_position), msg.num_forced_tokens,
    )  # fmt: skip


def update_from_proto(msg: scheduler_pb2.TokenUpdate) -> RequestUpdate:
    update = RequestUpdate(msg.req_id, token_ids=list(msg.token_ids))
    update.logprobs = [logprobs_from_proto(p) for p in msg.logprobs]
    update.finish_reason = msg.finish_reason or None
    if msg.HasField("matched_stop_token_id"):
        update.matched_stop_token_id = msg.matched_stop_token_id
    if msg.HasField("num_prompt_tokens"):
        update.num_prompt_tokens = msg.num_prompt_tokens
        update.num_cached_tokens = msg.num_cached_tokens
    if msg.error_code:
        name = status_of_number(msg.error_code).name
        update.error = error_for_code(name, msg.error_message or name)
    if msg.prompt_logprobs:
        update.prompt_logprobs = [logprobs_from_proto(p) for p in msg.prompt_logprobs]
    if msg.HasField("speculation"):
        update.speculation = speculation_from_proto(msg.speculation)
    return update


# -- executor information (Executor.GetInfo) ------------------------------------


def info_to_proto(info: ExecutorInfo) -> executor_pb2.GetInfoResponse:
    """Every field; an unstated limit (None) travels as 0."""
    values = {name: getattr(info, name) for name in _INFO_FIELDS}
    return executor_pb2.GetInfoResponse(**{k: v for k, v in values.items() if v is not None})


def info_from_proto(msg: executor_pb2.GetInfoResponse) -> ExecutorInfo:
    """Every field as the executor reported it (0 for an optional limit reads as None).

    Raises InvalidArgument when the sizes the scheduler plans with are missing.
    """
    missing = [n for n in ("page_size", "num_pages", "max_model_len") if not getattr(msg, n)]
    if missing:
        raise InvalidArgument(
            f"executor info of {msg.executor_id!r}: {', '.join(missing)} must be > 0"
        )
    values: dict[str, Any] = {name: getattr(msg, name) for name in _INFO_FIELDS}
    values["eos_token_ids"] = tuple(msg.eos_token_ids)
    for name in _OPTIONAL_INFO_FIELDS:
        values[name] = values[name] or None
    return ExecutorInfo(**values)


def submits_of(message: scheduler_pb2.StreamRequest) -> list[scheduler_pb2.SubmitRequest]:
    """The submits a `Scheduler.Stream` request carries, in order: its one submit, its
    `SubmitBatch`'s, or none (an abort or a hold release)."""
    op = message.WhichOneof("op")
    if op == "submit":
        return [message.submit]
    if op == "submit_batch":
        return list(message.submit_batch.submits)
    return []
