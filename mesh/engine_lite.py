"""A tiny in-process driver over the executor core: local pages, greedy batching, no prefix cache.

It stands in for the full in-process engine where only the executor matters
(`radixmesh generate`, fidelity tests): each prompt gets its own pages from a
local free list; every step runs all decodes, then prefill chunks up to the
token budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from radixmesh.errors import InvalidArgument, ResourceExhausted
from radixmesh.sampling import SamplingParams
from radixmesh.step import NewSequence, RunningSequence, StepPlan
from services.executor.core.executor import ExecutorCore


@dataclass(slots=True)
class GenerateOutput:
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    """Generated tokens."""
    finish_reason: str | None = None


@dataclass(slots=True)
class _Request:
    req_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    page_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    started: bool = False
    output: GenerateOutput | None = None

    @property
    def num_known_tokens(self) -> int:
        assert self.output is not None
        return len(self.prompt_token_ids) + len(self.output.token_ids)


def generate(
    core: ExecutorCore, prompts: list[list[int]], sampling: SamplingParams
) -> list[GenerateOutput]:
    """Runs every prompt to its finish through `core.step` and returns outputs in prompt order."""
    info = core.info
    if len(prompts) > info.max_num_seqs:
        raise ResourceExhausted(
            f"prompts: {len(prompts)} exceed max_num_seqs ({info.max_num_seqs})"
        )
    if any(not p for p in prompts):
        raise InvalidArgument("prompts: every prompt needs at least one token")
    free_pages = list(range(info.num_pages - 1, -1, -1))
    requests = [
        _Request(f"lite-{i}", list(p), sampling, output=GenerateOutput(list(p)))
        for i, p in enumerate(prompts)
    ]
    active = list(requests)
    step_id = 0
    while active:
        step_id += 1
        plan = StepPlan(step_id)
        budget = info.max_num_batched_tokens
        for req in sorted(active, key=lambda r: r.num_computed_tokens < len(r.prompt_token_ids)):
            num_tokens = min(req.num_known_tokens - req.num_computed_tokens, budget)
            if num_tokens == 0:
                continue
            budget -= num_tokens
            appended = _take_pages(
                req, req.num_computed_tokens + num_tokens, info.page_size, free_pages
            )
            if req.started:
                plan.running_seqs.append(RunningSequence(req.req_id, num_tokens, appended))
            else:
                req.started = True
                plan.new_seqs.append(
                    NewSequence(
                        req_id=req.req_id,
                        token_ids=req.prompt_token_ids,
                        num_prompt_tokens=len(req.prompt_token_ids),
                        num_computed_tokens=0,
                        num_scheduled_tokens=num_tokens,
                        page_ids=list(req.page_ids),
                        sampling=sampling,
                    )
                )
            req.num_computed_tokens += num_tokens
        result = core.step(plan)
        by_id = {r.req_id: r for r in active}
        for out in result.outputs:
            req = by_id[out.req_id]
            assert req.output is not None
            if out.token_id is not None:
                req.output.token_ids.append(out.token_id)
            if out.finish_reason is not None:
                req.output.finish_reason = out.finish_reason
                free_pages.extend(req.page_ids)
                active.remove(req)
    return [r.output for r in requests if r.output is not None]


def _take_pages(req: _Request, num_tokens: int, page_size: int, free_pages: list[int]) -> list[int]:
    needed = -(-num_tokens // page_size) - len(req.page_ids)
    if needed > len(free_pages):
        raise ResourceExhausted(f"KV pool: {needed} pages needed, {len(free_pages)} free")
    taken = [free_pages.pop() for _ in range(max(needed, 0))]
    req.page_ids.extend(taken)
    return taken
