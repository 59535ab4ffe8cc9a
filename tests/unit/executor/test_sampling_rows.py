"""Each buffer row's sampling parameters kept across steps (core/sampling_columns.py): a
step's inputs, gathered from its rows, equal inputs built from scratch from its
sequences' own parameters, whatever the churn (rows taken again by sequences that sample
otherwise, rows moving in the batch, penalties and seeds, inputs built at execute)."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
import torch

from radixmesh.sampling import SamplingParams
from radixmesh.step import NewSequence, RunningSequence, StepPlan, StepResult
from services.executor.core import step_batch
from services.executor.core.executor import ExecutorCore
from services.executor.core.sampling import Sampler, SamplingInputs, _fmix32
from services.executor.core.sampling_columns import (
    SamplingColumns,
    SamplingRows,
    row_keys,
    seed_key,
)
from services.executor.core.sequence import SequenceState
from services.executor.core.step_sampling import StepSampler
from services.executor.core.step_types import is_plain
from tests.unit.executor.conftest import TinyModel, make_core, random_prompt

VOCAB = 64
EOS = 2
MASK32 = 0xFFFFFFFF


def random_sampling(rng: random.Random, max_tokens: int | None = None) -> SamplingParams:
    """Every part of sampling a row may use, mixed."""
    kind = rng.randrange(9)
    common = {"max_tokens": max_tokens, "ignore_eos": rng.random() < 0.3}
    if kind == 0:
        return SamplingParams(temperature=0.0, **common)
    if kind == 1:
        min_tokens = min(rng.randrange(1, 4), max_tokens or 3)
        return SamplingParams(temperature=0.0, min_tokens=min_tokens, **common)
    if kind == 2:
        return SamplingParams(temperature=0.8, seed=rng.getrandbits(64), **common)
    if kind == 3:  # the executor draws the seed
        return SamplingParams(temperature=1.0, top_p=0.8, **common)
    if kind == 4:
        seed = rng.getrandbits(63)
        return SamplingParams(temperature=0.7, top_k=10, min_p=0.05, seed=seed, **common)
    if kind == 5:
        return SamplingParams(temperature=0.0, repetition_penalty=1.6, **common)
    if kind == 6:
        return SamplingParams(
            temperature=0.9, frequency_penalty=0.6, presence_penalty=0.4, seed=rng.randrange(99),
            **common,
        )  # fmt: skip
    if kind == 7:
        stop = (rng.randrange(3, VOCAB),)
        return SamplingParams(temperature=0.0, stop_token_ids=stop, min_tokens=1, **common)
    return SamplingParams(temperature=0.5, logprobs=True, top_logprobs=2, seed=5, **common)


def assert_same_inputs(got: SamplingInputs, want: SamplingInputs) -> None:
    for name in SamplingInputs.__slots__:
        a, b = getattr(got, name), getattr(want, name)
        if isinstance(b, torch.Tensor):
            assert isinstance(a, torch.Tensor), name
            assert a.dtype == b.dtype and torch.equal(a, b), name
        else:
            assert a == b, name


def from_scratch(
    sampler: StepSampler, seqs: list[SequenceState], output_lens, grammar_ends: frozenset[int]
) -> SamplingInputs:
    """The inputs of `seqs` built from their own parameters and histories, row by row."""
    lens = [int(n) for n in output_lens]
    params = [
        dataclasses.replace(s.sampling, min_tokens=0) if i in grammar_ends else s.sampling
        for i, s in enumerate(seqs)
    ]
    return sampler.sampler.prepare(
        params,
        [s.seed for s in seqs],
        lens,
        [s.token_ids[: s.num_prompt_tokens] for s in seqs],
        [
            s.token_ids[s.num_prompt_tokens : s.num_prompt_tokens + n]
            for s, n in zip(seqs, lens, strict=True)
        ],
        sampler.eos_token_ids,
    )


# ---------------------------------------------------------------- the columns


@pytest.mark.parametrize("seed", [0, 1, 2**32 - 1, 2**32, 2**63, 2**64 - 1, 0x0123456789ABCDEF])
def test_draw_keys_are_the_samplers_hash_of_seed_and_position(seed):
    positions = np.array([0, 1, 7, 2**31, 2**32 + 3], dtype=np.int64)
    low, high = torch.tensor([seed & MASK32]), torch.tensor([seed >> 32])
    key = _fmix32(_fmix32((low + 0x9E3779B9) & MASK32) ^ high)
    want = _fmix32(key ^ (torch.from_numpy(positions) & MASK32))
    assert seed_key(seed) == key.item()
    got = row_keys(np.full(len(positions), seed_key(seed)), positions)
    assert got.dtype == np.int64 and got.tolist() == want.tolist()


def test_a_row_written_again_holds_its_new_holders_parameters_only():
    rows = SamplingRows(4, VOCAB)
    first = SamplingParams(temperature=0.0, repetition_penalty=1.2, stop_token_ids=(5, 6))
    second = SamplingParams(temperature=0.9, top_k=7, seed=2**64 - 1, min_tokens=2)
    rows.write(2, first, 11, num_prompt_tokens=9)
    before = rows.gather(np.array([2, 2]))
    rows.write(2, second, 2**64 - 1, num_prompt_tokens=3)
    after = rows.gather(np.array([2]))
    want = SamplingColumns.of([second], [2**64 - 1], VOCAB)
    assert np.array_equal(after.floats, want.floats)
    assert np.array_equal(after.ints[:, :-1], want.ints[:, :-1])  # all but the prompt length
    assert after.num_prompt_tokens.tolist() == [3]
    assert after.stop_token_ids.tolist() == [()]
    assert before.stop_token_ids.tolist() == [(5, 6), (5, 6)]  # a gather is a copy
    assert before.num_prompt_tokens.tolist() == [9, 9]
    assert rows.gather(np.array([0])).present == 0  # a row never written: greedy, plain


def test_a_gather_of_rows_in_any_order_equals_the_columns_of_their_parameters():
    rng = random.Random(7)
    table = SamplingRows(16, VOCAB)
    params = [random_sampling(rng) for _ in range(16)]
    seeds = [rng.getrandbits(64) for _ in range(16)]
    for row, (p, s) in enumerate(zip(params, seeds, strict=True)):
        table.write(row, p, s, num_prompt_tokens=0)
    order = [rng.randrange(16) for _ in range(40)]  # repeats, any order
    got = table.gather(np.array(order))
    want = SamplingColumns.of([params[i] for i in order], [seeds[i] for i in order], VOCAB)
    assert np.array_equal(got.floats, want.floats)
    assert np.array_equal(got.ints, want.ints)
    assert got.stop_token_ids.tolist() == want.stop_token_ids.tolist()


def step_sampler(num_rows: int = 16) -> StepSampler:
    return StepSampler(Sampler(VOCAB, "cpu"), torch.zeros(num_rows, dtype=torch.int64), [EOS])


def sequence(rng: random.Random, req_id: str, row: int, sampling: SamplingParams) -> SequenceState:
    num_prompt, num_output = rng.randrange(1, 9), rng.randrange(0, 9)
    tokens = [rng.randrange(VOCAB + 3) for _ in range(num_prompt + num_output)]  # some outside
    return SequenceState(
        req_id, tokens, num_prompt, len(tokens) - 1, len(tokens) + 1, 4, sampling,
        seed=rng.getrandbits(64), row=row,
    )  # fmt: skip


@pytest.mark.parametrize("trial", range(6))
def test_inputs_from_the_rows_equal_inputs_built_from_the_sequences(trial):
    rng = random.Random(trial)
    sampler = step_sampler()
    rows = rng.sample(range(16), 12)
    seqs = [sequence(rng, f"r{i}", row, random_sampling(rng)) for i, row in enumerate(rows)]
    for seq in seqs:
        sampler.admit(seq)
    batch = rng.sample(seqs, 9)  # a step's rows, moved around
    lens = [len(s.token_ids) - s.num_prompt_tokens - rng.randrange(2) for s in batch]
    lifted = frozenset(rng.sample(range(9), 2))  # their grammar allows only stop tokens
    columns = sampler.columns(np.array([s.row for s in batch]))
    for ends in (frozenset(), lifted):
        got = sampler.inputs(batch, lens, columns, ends)
        assert_same_inputs(got, from_scratch(sampler, batch, lens, ends))


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(temperature=0.8, seed=3),  # its draw is keyed by its output length
        SamplingParams(temperature=0.0, min_tokens=5),  # EOS suppressed until 5 tokens
        SamplingParams(temperature=0.0, presence_penalty=0.5),  # reads the history
    ],
)
def test_inputs_that_read_lengths_or_histories_follow_them(sampling):
    rng = random.Random(0)
    sampler = step_sampler()
    seqs = [
        sequence(rng, "a", 0, SamplingParams(temperature=0.0)), sequence(rng, "b", 1, sampling)
    ]  # fmt: skip
    for seq in seqs:
        sampler.admit(seq)
    columns = sampler.columns(np.array([0, 1]))
    first, second = (sampler.inputs(seqs, [n, n], columns) for n in (2, 3))
    assert_same_inputs(second, from_scratch(sampler, seqs, [3, 3], frozenset()))
    if sampling.temperature > 0:
        assert first.keys is not None and second.keys is not None
        assert not torch.equal(first.keys, second.keys)
    if sampling.min_tokens:
        assert first.suppress_rows is not None
    if sampling.has_penalties:
        assert first.penalty_rows is not None and second.penalty_rows is not None
        assert len(second.penalty_rows) == len(first.penalty_rows) + 1  # one more output


# ---------------------------------------------------------------- the core


def new_seq(
    req_id: str, prompt: list[int], pages: list[int], sampling: SamplingParams
) -> NewSequence:
    return NewSequence(req_id, prompt, len(prompt), 0, len(prompt), pages, sampling)


def decode_tokens(core: ExecutorCore, new: NewSequence, first_step_id: int, num_steps: int):
    """`new` admitted, then decoded alone: its tokens, each step's prepared step."""
    tokens, prepared = [], []
    for step_id in range(first_step_id, first_step_id + num_steps):
        plan = StepPlan(step_id)
        if step_id == first_step_id:
            plan.new_seqs = [new]
        else:
            plan.running_seqs = [RunningSequence(new.req_id, 1)]
        prepared.append(core.prepare(plan))
        tokens += [o.token_id for o in core.execute(prepared[-1]).outputs]
    return tokens, prepared


def test_a_row_taken_by_a_sequence_that_samples_otherwise_uses_its_parameters(
    llama_model: TinyModel,
):
    penalised = SamplingParams(temperature=0.0, max_tokens=1, repetition_penalty=1.5)
    drawn = SamplingParams(temperature=0.9, top_k=12, seed=2**63 + 5, max_tokens=6)
    core = make_core(llama_model, max_num_seqs=2)
    a = new_seq("a", random_prompt(5, seed=3), [0, 1], penalised)
    first = core.prepare(StepPlan(1, new_seqs=[a]))
    (out,) = core.execute(first).outputs
    assert out.finish_reason == "length"  # its row is free again
    new = new_seq("b", random_prompt(7, seed=4), [2, 3, 4], drawn)
    tokens, prepared = decode_tokens(core, new, 2, 6)
    assert first.batch is not None
    for step in prepared:
        assert step.batch is not None and step.sampling_inputs is not None
        assert torch.equal(step.batch.sample_rows, first.batch.sample_rows)  # a's row
        assert step.sampling_inputs.repetition_rows is None  # nothing of a's penalty
        assert step.sampling_inputs.top_k is not None
    alone, _ = decode_tokens(make_core(llama_model, max_num_seqs=2), new, 1, 6)
    assert tokens == alone


def test_a_step_built_at_execute_keeps_the_parameters_of_a_row_taken_since(
    llama_model: TinyModel, monkeypatch: pytest.MonkeyPatch
):
    built: list[tuple[list[SequenceState], SamplingInputs]] = []
    inputs = StepSampler.inputs

    def recorded(self, seqs, output_lens, columns, grammar_ends=frozenset(), pending=()):
        result = inputs(self, seqs, output_lens, columns, grammar_ends, pending)
        built.append((list(seqs), result))
        if not pending:
            assert_same_inputs(result, from_scratch(self, seqs, output_lens, grammar_ends))
        return result

    monkeypatch.setattr(StepSampler, "inputs", recorded)
    penalised = SamplingParams(
        temperature=0.0, repetition_penalty=1.8, max_tokens=20, ignore_eos=True
    )
    drawn = SamplingParams(temperature=1.0, seed=9, max_tokens=20)
    a = new_seq("a", random_prompt(6, seed=1), [0, 1, 2], penalised)
    core = make_core(llama_model, max_num_seqs=1)
    core.step(StepPlan(1, new_seqs=[a]))
    decode = [RunningSequence("a", 1)]
    second = core.prepare(StepPlan(2, running_seqs=decode))
    third = core.prepare(StepPlan(3, running_seqs=decode))
    fourth = core.prepare(StepPlan(4, running_seqs=decode))
    assert third.sampling_inputs is not None  # lacks step 2's token: added on the device
    assert fourth.sampling_inputs is None  # lacks two: built at execute
    core.execute(second)
    core.execute(third)
    fifth = core.prepare(
        StepPlan(5, new_seqs=[new_seq("b", random_prompt(4, seed=2), [3, 4], drawn)],
                 finished_req_ids=["a"])
    )  # fmt: skip
    assert fourth.batch is not None and fifth.batch is not None
    assert torch.equal(fourth.batch.sample_rows, fifth.batch.sample_rows)  # b took a's row
    (out,) = core.execute(fourth).outputs
    seqs, at_execute = built[-1]
    assert [s.req_id for s in seqs] == ["a"]
    assert at_execute.repetition_rows is not None and at_execute.all_greedy  # a's, not b's
    (out_b,) = core.execute(fifth).outputs
    assert out_b.req_id == "b" and out_b.token_id is not None

    alone, _ = decode_tokens(make_core(llama_model, max_num_seqs=1), a, 1, 4)  # each executed
    assert alone[-1] == out.token_id


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(temperature=0.0, repetition_penalty=30.0, max_tokens=12),
        SamplingParams(temperature=0.0, frequency_penalty=2.0, presence_penalty=2.0, max_tokens=12),
        SamplingParams(temperature=0.3, seed=7, repetition_penalty=10.0, frequency_penalty=2.0,
                       max_tokens=12),
    ],
)  # fmt: skip
def test_a_penalised_step_prepared_ahead_samples_as_one_prepared_after(
    llama_model: TinyModel, sampling: SamplingParams
):
    """Each decode prepared while the one before is not executed (the last output token on
    the device only) is a plain step, and samples what steps each prepared after the one
    before executed sample: the pending token is in its penalties. A penalised sequence
    beside one without penalties, so the pending rows are a subset of the batch."""
    plain = SamplingParams(temperature=0.0, max_tokens=12)
    seqs = [new_seq("p", random_prompt(5, seed=11), [0, 1, 2, 3], sampling),
            new_seq("q", random_prompt(4, seed=12), [4, 5, 6, 7], plain)]  # fmt: skip
    decode = [RunningSequence("p", 1), RunningSequence("q", 1)]

    def run(ahead: bool) -> tuple[list[list[int]], int]:
        core = make_core(llama_model, max_num_seqs=2)
        outputs: list[list[int]] = []
        num_pending = 0
        prepared = core.prepare(StepPlan(1, new_seqs=list(seqs)))
        for step_id in range(2, 12):
            if not ahead:
                outputs.append([o.token_id for o in core.execute(prepared).outputs])
            following = core.prepare(StepPlan(step_id, running_seqs=list(decode)))
            assert following.sampling_inputs is not None and is_plain(following)
            num_pending += following.sampling_inputs.pending_rows is not None
            if ahead:
                outputs.append([o.token_id for o in core.execute(prepared).outputs])
            prepared = following
        outputs.append([o.token_id for o in core.execute(prepared).outputs])
        return outputs, num_pending

    ahead, num_pending = run(ahead=True)
    after, num_after = run(ahead=False)
    assert num_pending == 10 and num_after == 0
    assert ahead == after
    assert len({t for step in after for t in step[:1]}) > 1  # the penalty moved the argmax


def test_pending_last_tokens_join_the_penalties_pairs():
    """`with_last_tokens` adds each pending row's token as one more occurrence, and a row
    without a penalty gets pairs that change nothing."""
    sampler = Sampler(VOCAB, torch.device("cpu"))
    rep = SamplingParams(temperature=0.0, repetition_penalty=2.0)
    freq = SamplingParams(temperature=0.0, frequency_penalty=0.5, presence_penalty=0.25)
    prompts, outputs = [[5, 6], [7]], [[9], [9, 11]]
    columns = SamplingRows(2, VOCAB)
    for row, params in enumerate((rep, freq)):
        columns.write(row, params, 0, len(prompts[row]))
    gathered = columns.gather(np.arange(2))
    lens = np.array([2, 3])
    full = sampler.prepare([rep, freq], [0, 0], lens.tolist(), prompts,
                           [outputs[0] + [13], outputs[1] + [9]], [EOS])  # fmt: skip
    short = sampler.prepare_columns(
        gathered, lens, lambda i: (prompts[i], outputs[i]), [EOS],
        (np.array([0, 1]), np.array([1, 0])),
    )  # fmt: skip
    assert short.pending_rows is not None and short.needs_processing
    last_tokens = torch.tensor([9, 13])  # buffer row 1 holds row 0's token, row 0 row 1's
    assert short.pending_slots is not None
    resolved = sampler.with_last_tokens(short, last_tokens[short.pending_slots])
    assert resolved.pending_rows is None
    logits = torch.randn(2, VOCAB)
    torch.testing.assert_close(sampler.process(logits, resolved), sampler.process(logits, full),
                               rtol=0, atol=0)  # fmt: skip


@dataclasses.dataclass(slots=True)
class Churned:
    req_id: str
    prompt: list[int]
    sampling: SamplingParams
    pages: list[int]
    num_computed: int = 0
    num_known: int = 0


class ChurnScheduler:
    """Random churn planned one step ahead of the results it knows (a pipelined
    scheduler): each step admits a few requests of random sampling (taking rows and pages
    just freed), drops a few running ones, prefills prompts in chunks, decodes the rest."""

    def __init__(self, seed: int, max_num_seqs: int, num_pages: int, page_size: int) -> None:
        self.rng = random.Random(seed)
        self.max_num_seqs, self.page_size = max_num_seqs, page_size
        self.free_pages = list(range(num_pages - 1, -1, -1))
        self.running: dict[str, Churned] = {}
        self.num_admitted = 0

    def plan(self, step_id: int, admit: bool = True) -> StepPlan:
        rng, plan = self.rng, StepPlan(step_id)
        for req in list(self.running.values()):
            if rng.random() < 0.08:  # aborted
                plan.finished_req_ids.append(req.req_id)
                self._release(req.req_id)
        for req in self.running.values():
            num_tokens = min(req.num_known - req.num_computed, rng.randrange(1, 6))
            plan.running_seqs.append(RunningSequence(req.req_id, num_tokens))
            self._advance(req, num_tokens)
        rng.shuffle(plan.running_seqs)  # rows move in the batch
        room = self.max_num_seqs - len(self.running)
        for _ in range(min(room, rng.randrange(3)) if admit else 0):
            prompt = [rng.randrange(3, 128) for _ in range(rng.randrange(2, 11))]
            max_tokens = rng.randrange(1, 9)
            num_pages = -(-(len(prompt) + max_tokens) // self.page_size)
            if len(self.free_pages) < num_pages:
                break
            req = Churned(
                f"q{self.num_admitted}", prompt, random_sampling(rng, max_tokens),
                [self.free_pages.pop() for _ in range(num_pages)], num_known=len(prompt),
            )  # fmt: skip
            self.num_admitted += 1
            num_tokens = rng.randrange(1, len(prompt) + 1)  # a chunk, or the whole prompt
            plan.new_seqs.append(
                NewSequence(req.req_id, prompt, len(prompt), 0, num_tokens, req.pages, req.sampling)
            )
            self.running[req.req_id] = req
            self._advance(req, num_tokens)
        return plan

    def learn(self, result: StepResult) -> None:
        for out in result.outputs:
            if out.finish_reason is not None and out.req_id in self.running:
                self._release(out.req_id)

    def _advance(self, req: Churned, num_tokens: int) -> None:
        req.num_computed += num_tokens
        if req.num_computed == req.num_known:
            req.num_known += 1  # it samples

    def _release(self, req_id: str) -> None:
        self.free_pages += reversed(self.running.pop(req_id).pages)


def churn(core: ExecutorCore, seed: int, num_steps: int) -> list[list[tuple]]:
    """`num_steps` plans of random churn, step N + 1 prepared before step N executes; each
    step's outputs."""
    sched = ChurnScheduler(seed, core.config.max_num_seqs, 64, core.config.page_size)
    results = []
    prepared = core.prepare(sched.plan(1))
    for step_id in range(2, num_steps + 2):
        plan = sched.plan(step_id, admit=step_id < num_steps - 6) if step_id <= num_steps else None
        following = core.prepare(plan) if plan is not None else None
        result = core.execute(prepared)
        sched.learn(result)
        results.append([(o.req_id, o.token_id, o.finish_reason) for o in result.outputs])
        if following is None:
            break
        prepared = following
    return results


@pytest.mark.parametrize("seed", [0, 1])
def test_random_churn_samples_as_inputs_built_from_scratch_every_step(
    llama_model: TinyModel, monkeypatch: pytest.MonkeyPatch, seed
):
    checked: list[list[SequenceState]] = []
    at_execute: list[bool] = []
    with_pending: list[bool] = []
    incremental = StepSampler.inputs
    sample = StepSampler.sample

    def checking(self, seqs, output_lens, columns, grammar_ends=frozenset(), pending=()):
        got = incremental(self, seqs, output_lens, columns, grammar_ends, pending)
        short = [
            i for i, s in enumerate(seqs)
            if s.sampling.has_penalties and s.num_known_tokens - 1 - len(s.token_ids) == 1
        ]  # fmt: skip
        assert list(pending) == short
        with_pending.append(bool(pending))
        unresolved = dataclasses.replace(
            got, pending_rows=None, pending_slots=None, pending_penalties=None
        )
        assert_same_inputs(unresolved, from_scratch(self, seqs, output_lens, grammar_ends))
        checked.append(list(seqs))
        return got

    def recording(self, seqs, output_lens, inputs, *args, **kwargs):
        at_execute.append(inputs is None)
        return sample(self, seqs, output_lens, inputs, *args, **kwargs)

    monkeypatch.setattr(StepSampler, "inputs", checking)
    monkeypatch.setattr(StepSampler, "sample", recording)
    core = make_core(llama_model, max_num_seqs=6)
    outputs = churn(core, seed, num_steps=40)
    holders: dict[int, set[SamplingParams]] = {}
    for seqs in checked:
        for s in seqs:
            holders.setdefault(s.row, set()).add(s.sampling)
    assert max(len(p) for p in holders.values()) >= 3  # rows taken by other samplings
    assert any(with_pending)  # penalised histories one token short at prepare

    def rebuilt(self, seqs, output_lens, columns, grammar_ends=frozenset(), pending=()):
        return from_scratch(self, seqs, output_lens, grammar_ends)

    def at_execute_when_short(prepared, output_lens, sampler):
        """The reference: a penalised history short of a token leaves the inputs to be
        built at execute, from the whole history."""
        if all(
            s.num_known_tokens - 1 == len(s.token_ids)
            for s in prepared.samplers
            if s.sampling.has_penalties
        ):
            prepared.sampling_inputs = sampler.inputs(prepared.samplers, output_lens, None)

    monkeypatch.setattr(StepSampler, "inputs", rebuilt)
    monkeypatch.setattr(step_batch, "_prepare_inputs", at_execute_when_short)
    assert churn(make_core(llama_model, max_num_seqs=6), seed, num_steps=40) == outputs
