"""Speculative decoding in the executor core: verified drafts change nothing of the output
(greedy and seeded sampling), keep the target distribution, respect the grammar and stop
rules, and leave the sequence's position exactly past the tokens it kept."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import pytest
import torch

from radixmesh.errors import FailedPrecondition
from radixmesh.sampling import Constraint, ConstraintKind, SamplingParams
from radixmesh.step import NewSequence, RunningSequence, SequenceOutput, StepPlan
from services.executor.core.executor import ExecutorCore
from services.executor.core.spec import Draft, SpeculativeConfig
from tests.unit.executor.conftest import (
    FactoryGrammar,
    TinyModel,
    greedy,
    hf_logits,
    make_core,
    random_prompt,
)

PAGES_PER_SEQ = 16
PAGE_SIZE = 4


def spec_core(model: TinyModel, method: str = "ngram", **spec: int) -> ExecutorCore:
    config = SpeculativeConfig(method=method, **{"max_batch_size": 256, **spec})
    return make_core(model, num_pages=4096, max_num_seqs=256, speculative=config)


class FixedProposer:
    """Proposes the same tokens whatever the context (a draft that is often wrong)."""

    def __init__(self, token_ids: list[int]) -> None:
        self.token_ids = token_ids

    def propose(self, token_ids: Sequence[int], max_tokens: int, own=None) -> Draft:
        return Draft(self.token_ids[:max_tokens], len(self.token_ids))

    def index_for(self) -> None:
        return None

    def observe(self, token_ids: Sequence[int], num_prompt_tokens: int = 0) -> None:
        return None

    def take_in(self) -> None:
        return None


def generate(
    core: ExecutorCore,
    prompts: list[list[int]],
    sampling: list[SamplingParams],
    num_draft_tokens: int,
    constraint: Constraint | None = None,
) -> tuple[list[list[int]], list[SequenceOutput]]:
    """Every prompt to its end, decoding together; the tokens of each and every output."""
    ids = [f"r{i}" for i in range(len(prompts))]
    news = [
        NewSequence(
            rid, p, len(p), 0, len(p), list(range(i * PAGES_PER_SEQ, (i + 1) * PAGES_PER_SEQ)),
            s, constraint,
        )
        for i, (rid, p, s) in enumerate(zip(ids, prompts, sampling, strict=True))
    ]
    tokens: dict[str, list[int]] = {rid: [] for rid in ids}
    outputs: list[SequenceOutput] = []
    plan = StepPlan(1, new_seqs=news)
    step = 1
    live = set(ids)
    while live:
        result = core.step(plan)
        for out in result.outputs:
            outputs.append(out)
            if out.token_id is not None:
                tokens[out.req_id] += [*out.accepted_token_ids, out.token_id]
            if out.finish_reason is not None:
                live.discard(out.req_id)
        step += 1
        plan = StepPlan(
            step, running_seqs=[RunningSequence(r, 1, [], num_draft_tokens) for r in sorted(live)]
        )
    return [tokens[rid] for rid in ids], outputs


def repeating_prompt(seed: int) -> list[int]:
    motif = random_prompt(7, seed)
    return motif * 3 + motif[:3]


@pytest.mark.parametrize("method", ["ngram", "suffix"])
def test_greedy_outputs_are_token_identical_with_speculation(
    llama_model: TinyModel, method: str
) -> None:
    prompts = [repeating_prompt(s) for s in range(3)] + [random_prompt(9, 50 + s) for s in range(3)]
    sampling = [greedy(max_tokens=24, ignore_eos=True)] * len(prompts)
    off, _ = generate(make_core(llama_model, num_pages=1024), prompts, sampling, 0)
    core = spec_core(llama_model, method)
    on, outputs = generate(core, prompts, sampling, 4)
    assert on == off
    assert all(len(t) == 24 for t in on)
    stats = core.spec_stats.snapshot()
    assert stats.num_drafts > 0 and stats.num_accepted_tokens > 0  # the repeats are drafted
    assert sum(o.num_draft_tokens for o in outputs) == stats.num_draft_tokens
    assert sum(len(o.accepted_token_ids) for o in outputs) == stats.num_accepted_tokens
    assert stats.accepted_by_position[0] >= stats.accepted_by_position[-1]


def test_seeded_sampling_is_identical_with_speculation(llama_model: TinyModel) -> None:
    prompts = [repeating_prompt(s) for s in range(4)]
    sampling = [
        SamplingParams(temperature=0.7, top_k=8, seed=100 + i, max_tokens=20, ignore_eos=True)
        for i in range(4)
    ]
    off, _ = generate(make_core(llama_model, num_pages=1024), prompts, sampling, 0)
    on, _ = generate(spec_core(llama_model), prompts, sampling, 4)
    assert on == off


def test_position_and_pages_after_rejections(llama_model: TinyModel) -> None:
    core = spec_core(llama_model)
    core._proposer = FixedProposer([3, 4, 5, 6])  # mostly rejected
    prompt = random_prompt(10, 7)
    tokens, outputs = generate(core, [prompt], [greedy(max_tokens=13, ignore_eos=True)], 4)
    off, _ = generate(make_core(llama_model, num_pages=1024), [prompt], [greedy(13, ignore_eos=True)], 0)
    assert tokens == off and len(tokens[0]) == 13  # max_tokens holds inside accepted runs
    stats = core.spec_stats.snapshot()
    assert stats.num_draft_tokens > stats.num_accepted_tokens
    # each verifying step emits its accepted tokens plus one, never more than max_tokens
    produced = [len(o.accepted_token_ids) + 1 for o in outputs if o.token_id is not None]
    assert sum(produced) == 13


def test_sequence_state_is_exact_between_steps(llama_model: TinyModel) -> None:
    core = spec_core(llama_model)
    core._proposer = FixedProposer([3, 4, 5])
    prompt = random_prompt(10, 8)
    plan = StepPlan(1, new_seqs=[NewSequence("a", prompt, 10, 0, 10, list(range(8)), greedy(20))])
    core.step(plan)
    for step in range(2, 6):
        core.step(StepPlan(step, running_seqs=[RunningSequence("a", 1, [], 3)]))
        seq = core._seqs["a"]
        assert seq.num_known_tokens == len(seq.token_ids)
        assert seq.num_computed_tokens == len(seq.token_ids) - 1  # the last one is not fed
        assert not seq.verifying


def test_drafts_never_pass_the_pages(llama_model: TinyModel) -> None:
    core = spec_core(llama_model)
    core._proposer = FixedProposer([3, 4, 5, 6])
    prompt = random_prompt(7, 9)  # 2 pages of 4 hold 8 positions: room for no draft
    core.step(StepPlan(1, new_seqs=[NewSequence("a", prompt, 7, 0, 7, [0, 1], greedy(20))]))
    result = core.step(StepPlan(2, running_seqs=[RunningSequence("a", 1, [], 4)]))
    assert result.outputs[0].num_draft_tokens == 0
    result = core.step(StepPlan(3, running_seqs=[RunningSequence("a", 1, [2], 4)]))
    assert result.outputs[0].num_draft_tokens == 3  # position 8 + 3 drafts fill page 2


def test_a_large_batch_switches_speculation_off(llama_model: TinyModel) -> None:
    core = spec_core(llama_model, max_batch_size=2)
    prompts = [repeating_prompt(s) for s in range(3)]
    _, outputs = generate(core, prompts, [greedy(8, ignore_eos=True)] * 3, 4)
    assert core.spec_stats.snapshot().num_drafts == 0
    assert all(o.num_draft_tokens == 0 for o in outputs)


def test_a_step_prepared_before_a_verification_executes_is_refused(
    llama_model: TinyModel,
) -> None:
    core = spec_core(llama_model)
    core._proposer = FixedProposer([3, 4])
    prompt = random_prompt(10, 10)
    core.step(StepPlan(1, new_seqs=[NewSequence("a", prompt, 10, 0, 10, list(range(8)), greedy(20))]))
    verifying = core.prepare(StepPlan(2, running_seqs=[RunningSequence("a", 1, [], 2)]))
    with pytest.raises(FailedPrecondition, match="verifies a draft"):
        core.prepare(StepPlan(3, running_seqs=[RunningSequence("a", 1, [], 2)]))
    assert core.execute(verifying).outputs[0].num_draft_tokens == 2


class BanMatcher:
    """A grammar that refuses a set of tokens and follows accepts and rollbacks."""

    def __init__(self, banned: set[int]) -> None:
        self.banned = banned
        self.accepted: list[int] = []

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        bitmask[row].fill_(-1)
        for token_id in self.banned:
            word, bit = divmod(token_id, 32)
            bitmask[row, word] &= ~(1 << bit) if bit < 31 else 0x7FFFFFFF

    def accept(self, token_id: int) -> bool:
        if token_id in self.banned:
            return False
        self.accepted.append(token_id)
        return True

    def replay(self, token_ids: list[int]) -> None:
        self.accepted = list(token_ids)

    def is_stop_token(self, token_id: int) -> bool:
        return False

    def rollback(self, num_tokens: int) -> None:
        assert 0 <= num_tokens <= len(self.accepted)
        del self.accepted[len(self.accepted) - num_tokens :]


def test_the_grammar_cuts_a_draft_at_its_first_refused_token(llama_model: TinyModel) -> None:
    prompt = repeating_prompt(3)
    plain, _ = generate(make_core(llama_model, num_pages=1024), [prompt], [greedy(16, ignore_eos=True)], 0)
    banned = {plain[0][5], plain[0][9]}  # tokens the unconstrained output would take
    matchers: list[BanMatcher] = []

    def factory(_: Constraint) -> BanMatcher:
        matchers.append(BanMatcher(banned))
        return matchers[-1]

    constraint = Constraint(ConstraintKind.REGEX, ".*")
    sampling = [greedy(16, ignore_eos=True)]
    off, _ = generate(make_core(llama_model, FactoryGrammar(factory), num_pages=1024), [prompt], sampling, 0, constraint)
    core = make_core(
        llama_model, FactoryGrammar(factory), num_pages=1024,
        speculative=SpeculativeConfig(method="ngram", max_batch_size=8),
    )  # fmt: skip
    core._proposer = FixedProposer([*plain[0][:4], *banned])  # the banned ones get cut
    on, outputs = generate(core, [prompt], sampling, 4, constraint)
    assert on == off and not banned & set(on[0])
    assert matchers[-1].accepted == on[0][:-1]  # rolled back to the kept tokens
    assert any(o.num_draft_tokens for o in outputs)


def test_sampled_outputs_follow_the_target_distribution(llama_model: TinyModel) -> None:
    """Chi-square over (first, second) sampled tokens of 480 seeded requests whose second
    token is verified against a fixed draft, against the exact distribution of the model."""
    prompt = random_prompt(6, 11)
    temperature, top_k = 1.0, 2
    logits = hf_logits(llama_model.hf, prompt)[-1] / temperature
    first = _top_k_probs(logits, top_k)
    seconds = {
        t: _top_k_probs(hf_logits(llama_model.hf, [*prompt, t])[-1] / temperature, top_k)
        for t in first
    }
    expected = {(a, b): pa * pb for a, pa in first.items() for b, pb in seconds[a].items()}
    likely_second = max(expected, key=expected.__getitem__)[1]
    core = spec_core(llama_model)
    core._proposer = FixedProposer([likely_second])
    counts: Counter[tuple[int, int]] = Counter()
    num, batch = 480, 120
    for start in range(0, num, batch):
        sampling = [
            SamplingParams(temperature=temperature, top_k=top_k, seed=s, max_tokens=3)
            for s in range(start, start + batch)
        ]
        tokens, _ = generate(core, [prompt] * batch, sampling, 1)
        counts.update((t[0], t[1]) for t in tokens)
    stats = core.spec_stats.snapshot()
    assert stats.num_drafts >= num and 0 < stats.num_accepted_tokens < stats.num_draft_tokens
    chi2 = sum((counts[c] - num * p) ** 2 / (num * p) for c, p in expected.items())
    assert set(counts) <= set(expected)
    assert chi2 < 17.7  # 4 cells, 3 degrees of freedom: p = 0.0005


def _top_k_probs(logits: torch.Tensor, k: int) -> dict[int, float]:
    values, ids = logits.topk(k)
    probs = torch.softmax(values.double(), dim=-1)
    return dict(zip(ids.tolist(), probs.tolist(), strict=True))
