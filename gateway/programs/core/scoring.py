"""Select: score every choice by the model's log-probabilities after the context.

Each choice is one scoring request (prompt = context + choice tokens, no token
generated, prompt log-probabilities from the choice's first token); all are submitted together
so the scheduler runs them in the same step over the cached context. Methods:
token-length-normalized mean logprob (default), greedy token (how many leading tokens
greedy decoding would write; ties by mean), and unconditional-likelihood-normalized
(the sum minus the choice's sum after only the start tokens).

A choice is scored as the tokenizer writes it in context: the context's last tokens are
decoded and encoded again with the choice's text after them (`Boundary`), the context's
tokens stay where that agrees, and the choice's tokens start where it differs (a word
that merges with the context's trailing space replaces that space's token). The scores,
the token counts and the tokens the chosen choice appends to the context are those.
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
from services.common.logging import get_logger

if TYPE_CHECKING:
    from gateway.programs.core.runtime import ProgramRun, Scope

log = get_logger(__name__)
BOUNDARY_TOKENS = 16  # how many of the context's last tokens a choice may re-tokenize
_warned: set[tuple[str, str]] = set()  # (tokenizer, reason) already logged as choices alone


@dataclass(frozen=True, slots=True)
class InContext:
    """A choice's tokens after the context: the context's first `keep` tokens stay and
    `token_ids` follow (the first of them may start inside the context's last token's
    text, where the choice merges with it). `alone`: tokenized by itself, the context's
    tokens could not be reproduced from their text."""

    keep: int
    token_ids: tuple[int, ...]
    alone: bool = False


class Boundary:
    """Tokenizes choices in a context: once per context, the last tokens (up to
    BOUNDARY_TOKENS, after any start tokens) whose text encodes back to themselves."""

    def __init__(self, tokenizer: Tokenizer, tokens: list[int]) -> None:
        self.tokenizer = tokenizer
        self.tokens = tokens
        head = start_tokens(tokenizer)
        floor = len(head) if tokens[: len(head)] == head else 0
        self.window: tuple[int, str] | None = (len(tokens), "") if floor == len(tokens) else None
        for k in range(min(BOUNDARY_TOKENS, len(tokens) - floor), 0, -1):
            tail = tokens[-k:]
            text = tokenizer.decode(tail, skip_special_tokens=False)
            if tokenizer.encode_text(text) == tail:
                self.window = (len(tokens) - k, text)
                break

    def choice(self, text: str) -> InContext:
        if self.window is not None:
            start, tail_text = self.window
            joint = self.tokenizer.encode_text(tail_text + text)
            agree = 0
            for have, got in zip(self.tokens[start:], joint, strict=False):
                if have != got:
                    break
                agree += 1
            if start + agree >= 1 and agree < len(joint):
                return InContext(start + agree, tuple(joint[agree:]))
            reason = "in context the choice would rewrite the context's only token"
        else:
            reason = "the context's last tokens do not encode back from their text"
        if (self.tokenizer.name, reason) not in _warned:
            _warned.add((self.tokenizer.name, reason))
            log.info("select_choice_tokenized_alone", model=self.tokenizer.name, reason=reason)
        return InContext(len(self.tokens), tuple(self.tokenizer.encode_text(text)), alone=True)


@dataclass(frozen=True, slots=True)
class Scored:
    scores: tuple[ev.ChoiceScore, ...]
    order_key: list[tuple[float, float]]
    placed: list[InContext]  # each choice's tokens after the context, as scored
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
    if len(tokens) < 1:
        raise InvalidArgument(f"{s.path}: select needs context before it (append text first)")
    boundary = Boundary(tokenizer, tokens)
    placed = [boundary.choice(c) for c in s.choices]
    greedy = s.method is SelectMethod.GREEDY_TOKEN
    try:
        sampling = scoring_sampling(1, 1 if greedy else 0)
    except FailedPrecondition as exc:
        raise FailedPrecondition(f"{s.path}: {exc}") from None
    group = f"{run.run_id}/select/{s.path}"  # the choices are scheduled as one unit
    jobs = [(tokens[: p.keep] + list(p.token_ids), p.keep) for p in placed]
    unconditional = s.method is SelectMethod.UNCONDITIONAL_LIKELIHOOD_NORMALIZED
    if unconditional:
        head = start_tokens(tokenizer) or tokenizer.encode_text(s.choices[0])[:1]
        after_head = Boundary(tokenizer, head)
        for c in s.choices:
            p = after_head.choice(c)
            jobs.append((head[: p.keep] + list(p.token_ids), p.keep))
    requests = [
        run.request(
            scope,
            model,
            ids,
            dataclasses.replace(sampling, prompt_logprobs_start=start),  # type: ignore[call-arg]
            hold=False,
            group_id=group,
        )
        for ids, start in jobs
    ]
    requests = [dataclasses.replace(r, group_size=len(requests)) for r in requests]
    results = await asyncio.gather(
        *(prompt_logprobs(run.deps.backend, r, start) for r, (_, start) in zip(requests, jobs, strict=True))
    )
    usage = ev.Usage()
    for _, used in results:
        usage = usage + used
    scores, keys = [], []
    for i, (choice, p) in enumerate(zip(s.choices, placed, strict=True)):
        logprobs = results[i][0]
        total = sum(e.logprob for e in logprobs)
        mean = total / max(1, len(p.token_ids))
        if greedy:
            matched = 0
            for e in logprobs:
                if not e.top or e.top[0][0] != e.token_id:
                    break
                matched += 1
            key = (float(matched), mean)
        elif unconditional:
            plain_total = sum(e.logprob for e in results[len(placed) + i][0])
            key = (total - plain_total, 0.0)
        else:
            key = (mean, 0.0)
        keys.append(key)
        scored = tuple(ev.ScoredToken(e.token_id, e.logprob, tokenizer.token_text(e.token_id)) for e in logprobs)
        scores.append(ev.ChoiceScore(choice, key[0], total, len(p.token_ids), scored))
    return Scored(tuple(scores), keys, placed, usage)
