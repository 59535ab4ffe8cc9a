"""Intake checks: is a request well-formed for the executors that could serve it, and
is there room in the queue for it (shedding speculative work for any other, sheddable
work for interactive work)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from radixmesh.errors import InvalidArgument, ResourceExhausted
from radixmesh.sampling import Priority, SamplingParams
from services.scheduler.core.executor_state import ExecutorState
from services.scheduler.core.groups import check_group_size
from services.scheduler.core.request import Request


def check_prompt(tokens: Sequence[int], candidates: Sequence[ExecutorState]) -> int:
    """InvalidArgument naming the field when the executors could not take these tokens;
    else the least context limit among them (what the prompt was checked against)."""
    if not tokens:
        raise InvalidArgument("token_ids must not be empty")
    if min(tokens) < 0:
        raise InvalidArgument("token_ids must be non-negative")
    vocab_size = min(ex.info.vocab_size or 2**31 for ex in candidates)
    if max(tokens) >= vocab_size:
        raise InvalidArgument(f"token_ids must be below the vocabulary size {vocab_size}")
    max_model_len = min(ex.info.max_model_len for ex in candidates)
    if len(tokens) >= max_model_len:
        raise InvalidArgument(
            f"the prompt has {len(tokens)} tokens; the model's limit is {max_model_len - 1}"
        )
    return max_model_len


def check_request(
    tokens: Sequence[int],
    sampling: SamplingParams,
    group_id: str,
    group_size: int,
    candidates: Sequence[ExecutorState],
) -> None:
    """InvalidArgument naming the field when a submit is malformed for these executors:
    its prompt (`check_prompt`), a max_tokens or min_tokens the context has no room for (an
    output cut short at the limit would end with "length" where the caller asked for more), its
    group's size, or prompt log-probabilities asked from past the prompt's end."""
    max_model_len = check_prompt(tokens, candidates)
    for name in ("max_tokens", "min_tokens"):
        count = getattr(sampling, name)
        if count is not None and len(tokens) + count > max_model_len:
            raise InvalidArgument(
                f"sampling.{name} ({count}) plus the prompt's {len(tokens)} tokens "
                f"exceeds the model's limit of {max_model_len} tokens"
            )
    check_group_size(group_id, group_size)
    start = sampling.prompt_logprobs_start
    if start is not None and start > len(tokens):
        raise InvalidArgument(
            f"sampling.prompt_logprobs_start ({start}) must not exceed the prompt's "
            f"{len(tokens)} tokens"
        )


def make_room_in_queue(
    executors: Iterable[ExecutorState], req: Request, max_queue_len: int
) -> Request | None:
    """None when there is room; the request to drop for this one (the newest speculative
    one for any other class, else the newest sheddable one for an interactive one); else
    ResourceExhausted. The caller removes and ends the returned request."""
    executors = list(executors)
    num_waiting = sum(len(ex.queue) + len(ex.preparing) for ex in executors)
    if num_waiting < max_queue_len:
        return None
    classes = []
    if req.priority is not Priority.SPECULATIVE:
        classes.append(Priority.SPECULATIVE)
    if req.priority is Priority.INTERACTIVE:
        classes.append(Priority.SHEDDABLE)
    for priority in classes:
        shed = (ex.queue.newest_unleased(priority) for ex in executors)
        victim = max((r for r in shed if r is not None), key=lambda r: r.arrival_time, default=None)
        if victim is not None:
            return victim
    raise ResourceExhausted(
        f"queue full: {num_waiting} waiting requests (max_queue_len {max_queue_len})"
    )
