"""A multi-step plan's later steps prepared from the step before (core/step_batch.py)."""

from __future__ import annotations

import asyncio
import itertools

import numpy as np
import pytest
import torch

from radixmesh.sampling import SamplingParams
from radixmesh.step import NewSequence, RunningSequence, StepPlan
from services.executor.core.forward_batch import (
    ForwardBatch,
    PageTables,
    build_batch,
    build_decode_batch,
)
from services.executor.core.pipeline import StepPipeline
from services.executor.core.sequence import SequenceState
from services.executor.core.step_batch import next_step_seqs
from tests.unit.executor.conftest import TinyModel, make_core, random_prompt

STEP_IDS = itertools.count(1)


def state(req_id: str, sampling: SamplingParams, num_output: int = 2, row: int = 0) -> SequenceState:
    tokens = list(range(3 + num_output))
    return SequenceState(
        req_id, tokens, 3, len(tokens) - 1, len(tokens), 2, sampling, seed=7, row=row,
        has_device_token=True,
    )  # fmt: skip


@pytest.mark.parametrize("num_seqs", [1, 2, 7, 64])
def test_a_decode_batch_is_the_general_batch_of_one_device_token_per_sequence(num_seqs):
    rng = np.random.default_rng(num_seqs)
    tables = PageTables(80, 12)
    for row in range(80):
        tables.write(row, 0, rng.integers(0, 500, 12).tolist())
    rows = rng.permutation(80)[:num_seqs].astype(np.int64)
    starts = rng.integers(0, 12 * 16 - 1, num_seqs).astype(np.int64)  # widths differ
    every = np.ones(num_seqs, dtype=bool)
    general = build_batch(
        rows, starts, np.ones(num_seqs, dtype=np.int64), every, every,
        np.zeros(num_seqs, dtype=np.int64), tables, 16, torch.device("cpu"),
    )  # fmt: skip
    decode = build_decode_batch(rows, starts, tables, 16, torch.device("cpu"))
    for name in ForwardBatch.__slots__:
        a, b = getattr(general, name), getattr(decode, name)
        if isinstance(a, torch.Tensor):
            assert a.dtype == b.dtype and torch.equal(a, b), name
        else:
            assert a == b, name


def test_the_next_step_runs_the_sequences_still_going():
    going = state("going", SamplingParams(temperature=0.0, max_tokens=9))
    ended = state("ended", SamplingParams(temperature=0.0))
    ended.finished = True
    stopped = state("stopped", SamplingParams(temperature=0.0))
    stopped.stopped = True
    at_max = state("at_max", SamplingParams(temperature=0.0, max_tokens=2))  # 2 known outputs
    at_context = state("at_context", SamplingParams(temperature=0.0), num_output=3)
    before = [going, ended, stopped, at_max, at_context]
    assert next_step_seqs(before, max_model_len=6) == [going]  # at_context holds 6
    assert next_step_seqs(before, max_model_len=5) == []


def generate(core, prompts, samplings, num_steps: int, rounds: int, overlap: bool) -> dict:
    """Every prompt admitted, then `rounds` plans of `num_steps` decode steps each through
    a step pipeline; each request's tokens."""
    pages = [list(range(8 * i, 8 * i + 8)) for i in range(len(prompts))]
    news = [
        NewSequence(f"r{i}", p, len(p), 0, len(p), pages[i], s)
        for i, (p, s) in enumerate(zip(prompts, samplings, strict=True))
    ]

    async def run() -> dict:
        pipeline = StepPipeline("test", overlap_prepare=overlap)
        pipeline.attach(core)
        stream = pipeline.open(core, after_execute=lambda plan, result: result)
        tokens: dict[str, list[int]] = {n.req_id: [] for n in news}
        futures = stream.submit_steps(StepPlan(next(STEP_IDS), new_seqs=news))
        for _ in range(rounds):
            running = [RunningSequence(n.req_id, 1) for n in news]
            futures += stream.submit_steps(
                StepPlan(next(STEP_IDS), running_seqs=running, num_steps=num_steps)
            )
        for future in futures:
            for out in (await asyncio.wrap_future(future)).outputs:
                if out.token_id is not None:
                    tokens[out.req_id].append(out.token_id)
        await pipeline.close()
        return tokens

    return asyncio.run(run())


@pytest.mark.parametrize("overlap", [False, True])
def test_plans_of_four_steps_give_the_tokens_of_single_steps_with_mixed_sampling(
    llama_model: TinyModel, overlap
):
    prompts = [random_prompt(n, seed=n) for n in (5, 9, 3, 7)]
    samplings = [
        SamplingParams(temperature=0.0, max_tokens=6),  # ends inside the second plan
        SamplingParams(temperature=0.9, seed=11, max_tokens=30),
        SamplingParams(temperature=0.0, max_tokens=30, frequency_penalty=0.7),
        SamplingParams(temperature=0.0, max_tokens=30, min_tokens=9),
    ]
    results = []
    for num_steps, rounds in ((1, 12), (4, 3)):
        core = make_core(llama_model, num_pages=64, max_num_seqs=8)
        try:
            results.append(generate(core, prompts, samplings, num_steps, rounds, overlap))
        finally:
            core.shutdown()
    single, multi = results
    assert multi == single
    lengths = [len(t) for t in multi.values()]
    assert lengths[0] <= 6 and lengths[1:] == [13, 13, 13]  # r0 ends inside a plan
