"""Protobuf <-> scheduler core objects, at the edge only.

Intake (scheduler.proto): SubmitRequest -> `Submission`, RequestUpdate ->
TokenUpdate. Executor stream (executor.proto): StepPlan -> protobuf,
StepResult <- protobuf. Unset optional sampling fields take the dataclass
defaults; bad values raise InvalidArgument naming the field.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from radixmesh.errors import InvalidArgument, RadixmeshError
from radixmesh.sampling import Constraint, SamplingParams
from radixmesh.step import TokenLogprobs
from radixmesh.v1 import executor_pb2, inference_pb2, scheduler_pb2
from radixmesh.wire import (
    constraint_from_proto,
    sampling_from_proto,
)
from services.scheduler.core import ExecutorInfo, Priority, RequestUpdate

_PRIORITY = {
    inference_pb2.PRIORITY_UNSPECIFIED: Priority.INTERACTIVE,
    inference_pb2.PRIORITY_INTERACTIVE: Priority.INTERACTIVE,
    inference_pb2.PRIORITY_BATCH: Priority.BATCH,
    inference_pb2.PRIORITY_SHEDDABLE: Priority.SHEDDABLE,
}
# google.rpc.Code values of the errors the scheduler reports on a TokenUpdate
_RPC_CODE = {
    "CANCELLED": 1,
    "INVALID_ARGUMENT": 3,
    "DEADLINE_EXCEEDED": 4,
    "NOT_FOUND": 5,
    "RESOURCE_EXHAUSTED": 8,
    "FAILED_PRECONDITION": 9,
    "ABORTED": 10,
    "INTERNAL": 13,
    "UNAVAILABLE": 14,
    "UNAUTHENTICATED": 16,
}


@dataclass(frozen=True, slots=True)
class Submission:
    req_id: str
    model: str
    token_ids: list[int]
    sampling: SamplingParams
    constraint: Constraint | None
    priority: Priority
    deadline: float | None
    """On the scheduler's clock (time.monotonic)."""


def submission_from_proto(
    msg: scheduler_pb2.SubmitRequest, now_unix: float | None = None, now: float | None = None
) -> Submission:
    """Validated; the deadline moves from Unix milliseconds to the monotonic clock."""
    if not msg.req_id:
        raise InvalidArgument("submit.req_id must not be empty")
    where = f"submit[{msg.req_id!r}]."
    try:
        priority = _PRIORITY.get(msg.priority)
        if priority is None:
            raise InvalidArgument(f"priority must be a known Priority, got {msg.priority}")
        sampling = sampling_from_proto(msg.sampling)
        constraint = constraint_from_proto(msg.constraint) if msg.HasField("constraint") else None
    except InvalidArgument as exc:
        raise InvalidArgument(f"{where}{exc}") from None
    deadline = None
    if msg.deadline_unix_ms:
        now_unix = time.time() if now_unix is None else now_unix
        now = time.monotonic() if now is None else now
        deadline = now + (msg.deadline_unix_ms / 1000.0 - now_unix)
    return Submission(
        req_id=msg.req_id,
        model=msg.model,
        token_ids=list(msg.token_ids),
        sampling=sampling,
        constraint=constraint,
        priority=priority,
        deadline=deadline,
    )


def _logprobs_to_proto(out: inference_pb2.PositionLogprobs, lp: TokenLogprobs) -> None:
    out.sampled.token_id = lp.token_id
    out.sampled.logprob = lp.logprob
    add = out.top.add
    for token_id, logprob in lp.top:
        add(token_id=token_id, logprob=logprob)


def update_to_proto(
    update: RequestUpdate, req_id: str, out: scheduler_pb2.TokenUpdate | None = None
) -> scheduler_pb2.TokenUpdate:
    """Fills `out` (e.g. from `response.updates.add()`) with update, named req_id."""
    msg = out if out is not None else scheduler_pb2.TokenUpdate()
    msg.req_id = req_id
    msg.token_ids.extend(update.token_ids)
    for lp in update.logprobs:
        _logprobs_to_proto(msg.logprobs.add(), lp)
    if update.finish_reason is not None:
        msg.finish_reason = update.finish_reason
    if update.matched_stop_token_id is not None:
        msg.matched_stop_token_id = update.matched_stop_token_id
    if update.num_prompt_tokens is not None:
        msg.num_prompt_tokens = update.num_prompt_tokens
        msg.num_cached_tokens = update.num_cached_tokens or 0
    if update.error is not None:
        msg.error_code = error_code(update.error)
        msg.error_message = str(update.error)
    return msg


def error_code(error: RadixmeshError) -> int:
    return _RPC_CODE.get(error.code, _RPC_CODE["INTERNAL"])


# -- the executor stream ------------------------------------------------------


def info_from_proto(msg: executor_pb2.GetInfoResponse) -> ExecutorInfo:
    return ExecutorInfo(
        executor_id=msg.executor_id,
        model=msg.model,
        page_size=msg.page_size,
        num_pages=msg.num_pages,
        max_model_len=msg.max_model_len,
        vocab_size=msg.vocab_size or None,
        eos_token_ids=tuple(msg.eos_token_ids),
    )
