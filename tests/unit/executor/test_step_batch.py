"""A step's batch prepared from its sequences (core/step_batch.py): a multi-step plan's
later steps from the step before, and a verifying step's drafted decodes."""

from __future__ import annotations

import asyncio
import itertools

import numpy as np
import pytest
import torch

from radixmesh.sampling import SamplingParams
from radixmesh.step import NewSequence, RunningSequence, StepPlan
from services.executor.core import step_batch
from services.executor.core.forward_batch import (
    ForwardBatch,
    PageTables,
    build_batch,
    build_decode_batch,
    build_verify_batch,
)
from services.executor.core.pipeline import StepPipeline
from services.executor.core.sampling import Sampler
from services.executor.core.sequence import SequenceState
from services.executor.core.step_batch import next_step_seqs, prepare_batch
from services.executor.core.step_sampling import StepSampler
from services.executor.core.step_types import PreparedStep
from tests.unit.executor.conftest import TinyModel, make_core, random_prompt

STEP_IDS = itertools.count(1)


def state(
    req_id: str, sampling: SamplingParams, num_output: int = 2, row: int = 0
) -> SequenceState:
    tokens = list(range(3 + num_output))
    return SequenceState(
        req_id, tokens, 3, len(tokens) - 1, len(tokens), 2, sampling, seed=7, row=row,
        has_device_token=True,
    )  # fmt: skip


def random_tables(rng: np.random.Generator) -> PageTables:
    """80 rows of 12 random pages each."""
    tables = PageTables(80, 12)
    for row in range(80):
        tables.write(row, 0, rng.integers(0, 500, 12).tolist())
    return tables


def random_decodes(num_seqs: int, room: int):
    """A seeded generator, random page tables, and `num_seqs` distinct rows of them with
    start positions that leave `room` positions free (so the batch's widths differ)."""
    rng = np.random.default_rng(num_seqs)
    tables = random_tables(rng)
    rows = rng.permutation(80)[:num_seqs].astype(np.int64)
    starts = rng.integers(0, 12 * 16 - room, num_seqs).astype(np.int64)
    return rng, tables, rows, starts


def assert_same_batch(general: ForwardBatch, other: ForwardBatch) -> None:
    for name in ForwardBatch.__slots__:
        a, b = getattr(general, name), getattr(other, name)
        if isinstance(a, torch.Tensor):
            assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), name
        else:
            assert a == b, name


@pytest.mark.parametrize("num_seqs", [1, 2, 7, 64])
def test_a_decode_batch_is_the_general_batch_of_one_device_token_per_sequence(num_seqs):
    _, tables, rows, starts = random_decodes(num_seqs, room=1)
    every = np.ones(num_seqs, dtype=bool)
    general = build_batch(
        rows, starts, np.ones(num_seqs, dtype=np.int64), every, every,
        np.zeros(num_seqs, dtype=np.int64), tables, 16, torch.device("cpu"),
    )  # fmt: skip
    assert_same_batch(general, build_decode_batch(rows, starts, tables, 16, torch.device("cpu")))


@pytest.mark.parametrize("num_seqs", [1, 2, 7, 32])
def test_a_verify_batch_is_the_general_batch_of_its_drafted_decodes(num_seqs):
    rng, tables, rows, starts = random_decodes(num_seqs, room=6)
    drafts = [rng.integers(3, 99, rng.integers(0, 5)).tolist() for _ in range(num_seqs)]
    drafts[0] = drafts[0] or [5]  # a drafted step: some decode has a draft
    on_device = rng.random(num_seqs) < 0.5  # an undrafted decode reads its token there
    host = [
        None if on_device[i] and not d else [int(rng.integers(3, 99)), *d]
        for i, d in enumerate(drafts)
    ]
    q_lens = np.array([1 + len(d) for d in drafts], dtype=np.int64)
    from_device = np.array([tokens is None for tokens in host])
    token_ids = [t for tokens in host for t in (tokens or [0])]
    every = np.ones(num_seqs, dtype=bool)
    general = build_batch(
        rows, starts, q_lens, every, from_device, np.array(token_ids, dtype=np.int64),
        tables, 16, torch.device("cpu"), num_logits=q_lens,
    )  # fmt: skip
    verify = build_verify_batch(
        rows.tolist(), starts.tolist(), host, tables, 16, torch.device("cpu")
    )
    assert_same_batch(general, verify)


def drafted_decodes(sampler: StepSampler) -> tuple[list[SequenceState], list[list[int]]]:
    """Decodes of a verifying step: two drafted, one not (its token on the device), one
    not (its token on the host), mixed sampling; each admitted to `sampler`."""
    seqs = [
        state("a", SamplingParams(temperature=0.0), num_output=3, row=4),
        state("b", SamplingParams(temperature=0.8, seed=3, top_k=5), num_output=1, row=1),
        state("c", SamplingParams(temperature=0.0, min_tokens=9), num_output=2, row=6),
        state("d", SamplingParams(temperature=0.7), num_output=0, row=2),
    ]
    seqs[3].has_device_token = False
    for seq in seqs:
        sampler.admit(seq)
    return seqs, [[9, 8], [7, 6, 5], [], []]


def test_a_verifying_step_prepares_as_the_general_batch_does(monkeypatch):
    """`prepare_verify` against `prepare_batch`'s general path: the same batch, samplers,
    sampling columns and planned state."""
    sampler = StepSampler(Sampler(100, torch.device("cpu")), torch.zeros(8, dtype=torch.int64), [1])
    tables = PageTables(8, 4)
    for row in range(8):
        tables.write(row, 0, [4 * row + p for p in range(4)])
    prepared = []
    for fast in (True, False):
        if not fast:
            monkeypatch.setattr(step_batch, "prepare_verify", lambda *args: False)
        seqs, drafts = drafted_decodes(sampler)
        step = PreparedStep(1, 0)
        prepare_batch(step, seqs, [1] * len(seqs), drafts, tables, 16, torch.device("cpu"), sampler)
        prepared.append((step, seqs))
    (fast_step, fast_seqs), (step, seqs) = prepared
    assert_same_batch(step.batch, fast_step.batch)
    assert [s.req_id for s in fast_step.samplers] == [s.req_id for s in step.samplers]
    assert (fast_step.sampler_rows, fast_step.output_lens) == (step.sampler_rows, step.output_lens)
    assert fast_step.drafts == step.drafts == [[9, 8], [7, 6, 5], [], []]
    assert fast_step.sampling_inputs is None and step.sampling_inputs is None  # at execute
    for name in ("floats", "ints", "stop_token_ids"):
        a, b = getattr(fast_step.sampling_columns, name), getattr(step.sampling_columns, name)
        assert np.array_equal(a, b), name
    planned = ("num_computed_tokens", "num_known_tokens", "verifying", "has_device_token")
    for a, b in zip(fast_seqs, seqs, strict=True):
        assert [getattr(a, f) for f in planned] == [getattr(b, f) for f in planned], a.req_id


def test_a_drafted_step_with_a_prefill_chunk_is_prepared_by_the_general_path():
    """A one-token chunk short of its prompt's end does not sample: no verify batch."""
    sampler = StepSampler(Sampler(100, torch.device("cpu")), torch.zeros(8, dtype=torch.int64), [1])
    tables = PageTables(8, 4)
    seqs, drafts = drafted_decodes(sampler)
    chunk = SequenceState(
        "chunk", list(range(9)), 9, 4, 9, 3, SamplingParams(temperature=0.0), seed=1, row=7
    )
    sampler.admit(chunk)
    step = PreparedStep(1, 0)
    assert not step_batch.prepare_verify(
        step, [*seqs, chunk], [1] * 5, [*drafts, []], tables, 16, torch.device("cpu"), sampler
    )
    assert step.batch is None and seqs[0].num_computed_tokens == 5  # nothing changed
    prepare_batch(
        step, [*seqs, chunk], [1] * 5, [*drafts, []], tables, 16, torch.device("cpu"), sampler
    )
    assert [s.req_id for s in step.samplers] == ["a", "b", "c", "d"]  # the chunk samples not
    assert step.sampler_rows == [0, 1, 2, 3, -1] and chunk.num_computed_tokens == 5


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
