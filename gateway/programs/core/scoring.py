"""Select: score every choice by the model's log-probabilities after the context.

Each choice is one scoring request (prompt = context + choice tokens, no token
generated, prompt log-probabilities from the context's end); all are submitted together
so the scheduler runs them in the same step over the cached context. Methods:
token-length-normalized mean logprob (default), greedy token (how many leading tokens
greedy decoding would write; ties by mean), and unconditional-likelihood-normalized
(the sum minus the choice's sum after only the start tokens).
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.core.prepare import PreparedRequest
from gateway.core.tokenizer import Tokenizer
from gateway.programs.core import events as ev
from gateway.programs.core.context import start_tokens
from gateway.programs.core.model import Select, SelectMethod
from gateway.programs.core.port import ProgramBackend
from radixmesh.errors import FailedPrecondition, InvalidArgument
from radixmesh.sampling import SamplingParams
from radixmesh.step import TokenLogprobs

if TYPE_CHECKING:
    from gateway.programs.core.runtime import ProgramRun, Scope


@dataclass(frozen=True, slots=True)
class Scored:
    scores: tuple[ev.ChoiceScore, ...]
    order_key: list[tuple[float, float]]
    choice_tokens: list[list[int]]
    usage: ev.Usage


def scoring_sampling(start: int, top_logprobs: int) -> SamplingParams:
    """Score only: prompt logprobs of positions >= start, no token generated."""
    fields: dict[str, Any] = {"prompt_logprobs_start": start, "max_tokens": 0}
    if "prompt_logprobs_start" not in SamplingParams.__dataclass_fields__:
        raise FailedPrecondition("select needs prompt log-probabilities, which this build lacks")
    return SamplingParams(temperature=0.0, top_logprobs=top_logprobs, **fields)


async def prompt_logprobs(
    backend: ProgramBackend, request: PreparedRequest, start: int
) -> tuple[list[TokenLogprobs], ev.Usage]:
    found: list[TokenLogprobs] = []
    usage = ev.Usage()
    async for update in backend.submit(request):
        if update.error is not None:
            raise update.error
        found += getattr(update, "prompt_logprobs", None) or []
        if update.num_prompt_tokens is not None:
            usage = ev.Usage(update.num_prompt_tokens, 0, update.num_cached_tokens or 0)
    expected = len(request.prompt_token_ids) - start
    if len(found) != expected:
        raise FailedPrecondition(
            f"the scheduler returned {len(found)} prompt logprobs for {expected} scored tokens"
        )
    return found, usage


async def score_choices(
    run: ProgramRun, s: Select, scope: Scope, model: str, tokenizer: Tokenizer, tokens: list[int]
) -> Scored:
    if not run.deps.backend.supports_prompt_logprobs:
        raise FailedPrecondition(f"{s.path}: the scheduler does not serve prompt log-probabilities")
    start = len(tokens)
    if start < 1:
        raise InvalidArgument(f"{s.path}: select needs context before it (append text first)")
    choice_tokens = [tokenizer.encode_text(c) for c in s.choices]
    greedy = s.method is SelectMethod.GREEDY_TOKEN
    try:
        sampling = scoring_sampling(start, 1 if greedy else 0)
    except FailedPrecondition as exc:
        raise FailedPrecondition(f"{s.path}: {exc}") from None
    group = f"{run.run_id}/select/{s.path}"  # the choices are scheduled as one unit
    requests = [run.request(scope, model, tokens + ids, sampling, hold=False, group_id=group) for ids in choice_tokens]
    unconditional = s.method is SelectMethod.UNCONDITIONAL_LIKELIHOOD_NORMALIZED
    if unconditional:
        head = start_tokens(tokenizer) or choice_tokens[0][:1]
        plain = dataclasses.replace(sampling, prompt_logprobs_start=len(head))  # type: ignore[call-arg]
        requests += [run.request(scope, model, head + ids, plain, hold=False, group_id=group) for ids in choice_tokens]
        starts = [start] * len(choice_tokens) + [len(head)] * len(choice_tokens)
    else:
        starts = [start] * len(choice_tokens)
    requests = [dataclasses.replace(r, group_size=len(requests)) for r in requests]
    results = await asyncio.gather(
        *(prompt_logprobs(run.deps.backend, r, n) for r, n in zip(requests, starts, strict=True))
    )
    usage = ev.Usage()
    for _, used in results:
        usage = usage + used
    scores, keys = [], []
    for i, (choice, ids) in enumerate(zip(s.choices, choice_tokens, strict=True)):
        logprobs = results[i][0]
        total = sum(p.logprob for p in logprobs)
        mean = total / max(1, len(ids))
        if greedy:
            matched = 0
            for p in logprobs:
                if not p.top or p.top[0][0] != p.token_id:
                    break
                matched += 1
            key = (float(matched), mean)
        elif unconditional:
            plain_total = sum(p.logprob for p in results[len(choice_tokens) + i][0])
            key = (total - plain_total, 0.0)
        else:
            key = (mean, 0.0)
        keys.append(key)
        scores.append(ev.ChoiceScore(choice, key[0], total, len(ids)))
    return Scored(tuple(scores), keys, choice_tokens, usage)
