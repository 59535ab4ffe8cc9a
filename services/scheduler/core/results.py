"""Step results into request updates: each output's tokens, log probabilities and finish.

`read_outputs` is the scheduler's half of a step result that needs no cache or
executor round trip: it appends the tokens to their requests, builds one update
per request that moved, and names those that finished (the step loop then
commits their leases, keeps their holds and delivers the updates).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import structlog

from radixmesh.step import SequenceOutput, StepResult, TokenLogprobs
from radixmesh.updates import RequestUpdate
from services.scheduler.core.executor_state import ExecutorState
from services.scheduler.core.request import Request
from services.scheduler.core.stats import SchedulerStats

log = structlog.get_logger(__name__)


@dataclass(slots=True)
class StepOutcome:
    updates: list[RequestUpdate] = field(default_factory=list)
    """One per request that produced a token or finished, in output order."""
    finished: list[Request] = field(default_factory=list)
    """Requests the step ended (the executor dropped them itself)."""
    holding: list[Request] = field(default_factory=list)
    """Those of `finished` that ended normally with a hold_id: their context is kept."""


def read_outputs(
    ex: ExecutorState,
    result: StepResult,
    requests: Mapping[str, Request],
    now: float,
    stats: SchedulerStats,
) -> StepOutcome:
    """Changes the requests (tokens, prompt log probabilities, positions) and the stats;
    outputs of requests no longer on `ex` (aborted meanwhile) are skipped. The rows are
    read in the step's order, a columnar result's plain rows without an object each."""
    outcome = StepOutcome()
    decoded: list[Request] = []
    """Requests whose only news is one token (most of a decode step): their stats together."""
    if not result.plain_req_ids:
        updates, executor_id = outcome.updates, ex.executor_id
        for out in result.outputs:
            token_id = out.token_id
            if token_id is not None and not out.prompt_logprobs and _is_plain(out):
                req = requests.get(out.req_id)
                if req is not None and req.executor_id == executor_id and req.reported:
                    req.output_token_ids.append(token_id)
                    updates.append(RequestUpdate(req.req_id, [token_id]))
                    decoded.append(req)
                    continue
            _read_output(ex, out, requests, now, stats, outcome, decoded)
    else:
        plain_ids, plain_tokens = result.plain_req_ids, result.plain_token_ids
        done = 0  # plain rows read
        for i, (row, out) in enumerate(zip(result.output_rows, result.outputs, strict=True)):
            upto = row - i  # plain rows before this output
            if upto > done:
                ids, tokens = plain_ids[done:upto], plain_tokens[done:upto]
                _read_plain(ex, ids, tokens, requests, now, stats, outcome, decoded)
                done = upto
            _read_output(ex, out, requests, now, stats, outcome, decoded)
        if done:
            plain_ids, plain_tokens = plain_ids[done:], plain_tokens[done:]
        _read_plain(ex, plain_ids, plain_tokens, requests, now, stats, outcome, decoded)
    stats.tokens(decoded, now)
    return outcome


def _read_plain(
    ex: ExecutorState,
    req_ids: list[str],
    token_ids: list[int],
    requests: Mapping[str, Request],
    now: float,
    stats: SchedulerStats,
    outcome: StepOutcome,
    decoded: list[Request],
) -> None:
    """Columnar plain rows: each its request's token (a first token as any output)."""
    updates, executor_id = outcome.updates, ex.executor_id
    for req_id, token_id in zip(req_ids, token_ids, strict=True):
        req = requests.get(req_id)
        if req is None or req.executor_id != executor_id:
            continue  # aborted meanwhile
        if req.reported:
            req.output_token_ids.append(token_id)
            updates.append(RequestUpdate(req_id, [token_id]))
            decoded.append(req)
        else:
            first = SequenceOutput(req_id, token_id)
            _read_output(ex, first, requests, now, stats, outcome, decoded)


def _read_output(
    ex: ExecutorState,
    out: SequenceOutput,
    requests: Mapping[str, Request],
    now: float,
    stats: SchedulerStats,
    outcome: StepOutcome,
    decoded: list[Request],
) -> None:
    req = requests.get(out.req_id)
    if req is None or req.executor_id != ex.executor_id:
        return  # aborted meanwhile
    if out.prompt_logprobs:
        take_prompt_logprobs(req, out.prompt_logprobs, out.prompt_logprobs_position)
    token_id = out.token_id
    if token_id is None:
        if out.finish_reason is None:
            return  # a prefill chunk that did not reach the end of the prompt
    elif _is_plain(out) and req.reported:
        req.output_token_ids.append(token_id)
        outcome.updates.append(RequestUpdate(req.req_id, [token_id]))
        decoded.append(req)
        return
    update = start_update(req)
    if out.token_id is not None:
        _take_tokens(req, out, update)
        stats.token(req, now)
    if out.finish_reason is not None:
        update.finish_reason = out.finish_reason
        update.matched_stop_token_id = out.matched_stop_token_id
        if req.spec.num_drafts:
            update.speculation = req.spec
        outcome.finished.append(req)
        if req.hold_id is not None and out.finish_reason in ("stop", "length"):
            outcome.holding.append(req)
        stats.finished(req, now, out.finish_reason, "OK")
    outcome.updates.append(update)


def _is_plain(out: SequenceOutput) -> bool:
    """out is one sampled token and nothing else: no drafts, logprobs or finish."""
    return (
        out.finish_reason is None
        and out.logprobs is None
        and not out.num_draft_tokens
        and not out.accepted_token_ids
    )


def _take_tokens(req: Request, out: SequenceOutput, update: RequestUpdate) -> None:
    assert out.token_id is not None
    if out.accepted_token_ids:  # verified draft tokens come first
        req.output_token_ids.extend(out.accepted_token_ids)
        update.token_ids.extend(out.accepted_token_ids)
        if req.on_executor:  # their KV is computed: the position moves past them
            req.num_computed_tokens += len(out.accepted_token_ids)
    if out.num_draft_tokens:
        req.spec.record(out.num_draft_tokens, len(out.accepted_token_ids), out.num_forced_tokens)
    req.output_token_ids.append(out.token_id)
    update.token_ids.append(out.token_id)
    if out.logprobs is not None:
        update.logprobs.append(out.logprobs)


def start_update(req: Request) -> RequestUpdate:
    """An update for req; its first one also carries the prompt's counts and logprobs."""
    update = RequestUpdate(req.req_id)
    if not req.reported:
        req.reported = True
        update.num_prompt_tokens = len(req.prompt_token_ids)
        update.num_cached_tokens = req.num_cached_tokens or 0
        update.prompt_logprobs = req.prompt_logprobs
    return update


def take_prompt_logprobs(req: Request, entries: list[TokenLogprobs], position: int) -> None:
    """Append a step's prompt log probabilities (for positions position, +1, ...) to req's,
    skipping positions it has already (a resumed request recomputes some)."""
    start = req.sampling.prompt_logprobs_start
    if start is None:
        return
    skip = start + len(req.prompt_logprobs) - position
    if skip < 0:
        log.error("prompt logprobs out of order", req_id=req.req_id, position=position)
        return
    room = req.num_wanted_prompt_logprobs - len(req.prompt_logprobs)
    req.prompt_logprobs += entries[skip : skip + max(0, room)]
