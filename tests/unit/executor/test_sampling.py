"""The vectorised sampler against plain per-row references."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest
import torch

from radixmesh.errors import InvalidArgument
from radixmesh.sampling import SamplingParams
from services.executor.core.sampling import (
    UNIFORM_BITS,
    Sampler,
    SamplingInputs,
    _fmix32,
    _mul32,
    filter_logits,
    noise_from_bits,
    race,
)

CPU = torch.device("cpu")
EOS = 2


def make_sampler(vocab_size: int, **kwargs) -> Sampler:
    return Sampler(vocab_size, CPU, **kwargs)


def prepare(
    sampler: Sampler,
    params: list[SamplingParams],
    *,
    seeds: list[int] | None = None,
    output_lens: list[int] | None = None,
    prompts: list[list[int]] | None = None,
    outputs: list[list[int]] | None = None,
    eos: tuple[int, ...] = (EOS,),
) -> SamplingInputs:
    n = len(params)
    outputs = outputs if outputs is not None else [[] for _ in range(n)]
    return sampler.prepare(
        params,
        seeds if seeds is not None else list(range(n)),
        output_lens if output_lens is not None else [len(o) for o in outputs],
        prompts if prompts is not None else [[] for _ in range(n)],
        outputs,
        list(eos),
    )


def random_history(rng: random.Random, vocab_size: int, length: int) -> list[int]:
    return [rng.randrange(vocab_size) for _ in range(length)]


# ---------------------------------------------------------------- references


def reference_penalized(
    row: list[float], p: SamplingParams, prompt: list[int], output: list[int]
) -> list[float]:
    out = list(row)
    for token in set(prompt) | set(output):
        value = out[token]
        out[token] = value / p.repetition_penalty if value > 0 else value * p.repetition_penalty
    for token, count in Counter(output).items():
        out[token] -= p.frequency_penalty * count + p.presence_penalty
    return out


def reference_probs(row: list[float], p: SamplingParams) -> list[float]:
    """Filtered softmax, one row, in float64 with plain loops."""
    scaled = [v / p.temperature for v in row]
    order = sorted(range(len(row)), key=lambda i: -scaled[i])
    keep = order[: p.top_k] if p.top_k > 0 else order
    if p.top_p < 1.0:
        total = sum(math.exp(scaled[i]) for i in keep)
        mass, kept = 0.0, []
        for i in keep:
            if mass >= p.top_p:
                break
            kept.append(i)
            mass += math.exp(scaled[i]) / total
        keep = kept
    if p.min_p > 0.0:
        best = math.exp(scaled[keep[0]])
        keep = [i for i in keep if math.exp(scaled[i]) >= p.min_p * best]
    total = sum(math.exp(scaled[i]) for i in keep)
    return [math.exp(scaled[i]) / total if i in keep else 0.0 for i in range(len(row))]


# ---------------------------------------------------------------- greedy


def test_greedy_is_argmax():
    torch.manual_seed(0)
    sampler = make_sampler(50)
    logits = torch.randn(8, 50)
    result = sampler.sample(logits, prepare(sampler, [SamplingParams(temperature=0)] * 8))
    assert torch.equal(result.token_ids, logits.argmax(dim=-1))
    assert result.token_ids.dtype == torch.int64
    assert result.logprobs is None and result.top_ids is None


def test_greedy_ignores_padded_columns_and_reads_bf16():
    torch.manual_seed(1)
    sampler = make_sampler(40)
    logits = torch.randn(4, 48).to(torch.bfloat16)
    logits[:, 40:] = 100.0  # padding beyond the vocab must never win
    result = sampler.sample(logits, prepare(sampler, [SamplingParams(temperature=0)] * 4))
    assert torch.equal(result.token_ids, logits[:, :40].float().argmax(dim=-1))


def test_greedy_rows_in_a_sampled_batch_take_argmax():
    torch.manual_seed(2)
    sampler = make_sampler(30)
    params = [SamplingParams(temperature=0), SamplingParams(temperature=1.0, top_k=5)] * 6
    logits = torch.randn(12, 30)
    result = sampler.sample(logits, prepare(sampler, params))
    assert torch.equal(result.token_ids[0::2], logits[0::2].argmax(dim=-1))
    top5 = logits[1::2].topk(5, dim=-1).indices
    assert (top5 == result.token_ids[1::2, None]).any(dim=-1).all()


def test_unfiltered_batch_skips_the_sort_inputs():
    sampler = make_sampler(30)
    inputs = prepare(sampler, [SamplingParams(temperature=0.8), SamplingParams(top_p=1.0)])
    assert inputs.top_k is None and inputs.top_p is None and inputs.min_p is None
    assert inputs.sample_rows is None and not inputs.needs_processing


# ---------------------------------------------------------------- penalties


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(repetition_penalty=1.3),
        SamplingParams(repetition_penalty=0.7),
        SamplingParams(frequency_penalty=0.6),
        SamplingParams(presence_penalty=-0.8),
        SamplingParams(repetition_penalty=1.5, frequency_penalty=-1.0, presence_penalty=0.5),
    ],
    ids=["rep>1", "rep<1", "frequency", "presence", "all"],
)
def test_penalties_match_reference(params):
    rng = random.Random(3)
    torch.manual_seed(3)
    vocab = 64
    sampler = make_sampler(vocab)
    rows = [params, SamplingParams(), params, SamplingParams(temperature=0), params]
    prompts = [random_history(rng, vocab, rng.randrange(0, 40)) for _ in rows]
    outputs = [random_history(rng, vocab, rng.randrange(0, 30)) for _ in rows]
    outputs[0] = [7, 7, 7, 9] + outputs[0]  # repeated tokens exercise counts
    logits = torch.randn(len(rows), vocab) * 3
    inputs = prepare(sampler, rows, prompts=prompts, outputs=outputs)
    processed = sampler.process(logits, inputs)
    for i, p in enumerate(rows):
        expected = reference_penalized(logits[i].tolist(), p, prompts[i], outputs[i])
        torch.testing.assert_close(processed[i], torch.tensor(expected), rtol=1e-6, atol=1e-6)
    greedy = [SamplingParams(temperature=0, **_penalty_fields(p)) for p in rows]
    result = sampler.sample(logits, prepare(sampler, greedy, prompts=prompts, outputs=outputs))
    assert torch.equal(result.token_ids, processed.argmax(dim=-1))
    assert not torch.equal(processed, logits)


def _penalty_fields(p: SamplingParams) -> dict:
    return {
        "repetition_penalty": p.repetition_penalty,
        "frequency_penalty": p.frequency_penalty,
        "presence_penalty": p.presence_penalty,
    }


def test_sample_leaves_logits_untouched():
    sampler = make_sampler(16)
    logits = torch.randn(2, 16)
    before = logits.clone()
    params = [SamplingParams(repetition_penalty=2.0, top_k=3, min_tokens=2)] * 2
    sampler.sample(logits, prepare(sampler, params, outputs=[[1, 2], [3]]))
    assert torch.equal(logits, before)


# ---------------------------------------------------------------- min_tokens


def test_min_tokens_suppresses_eos_and_stop_ids_until_reached():
    vocab = 20
    sampler = make_sampler(vocab)
    logits = torch.zeros(4, vocab)
    logits[:, [EOS, 5, 11]] = 50.0  # EOS, a stop id and another EOS id dominate
    params = [SamplingParams(temperature=0, min_tokens=3, stop_token_ids=(5,))] * 2 + [
        SamplingParams(min_tokens=3, stop_token_ids=(5, 99), ignore_eos=True, seed=1),
        SamplingParams(temperature=0, min_tokens=3),
    ]
    inputs = prepare(sampler, params, output_lens=[0, 2, 1, 3], eos=(EOS, 11))
    processed = sampler.process(logits, inputs)
    for row in range(3):
        assert processed[row, [EOS, 5, 11]].eq(float("-inf")).all()
    assert processed[3].eq(logits[3]).all()  # min_tokens reached: nothing suppressed
    tokens = sampler.sample(logits, inputs).token_ids.tolist()
    assert all(t not in (EOS, 5, 11) for t in tokens[:3])
    assert tokens[3] == EOS  # argmax picks the first of the tied maxima


# ---------------------------------------------------------------- bitmask


def _bitmask(allowed: torch.Tensor) -> torch.Tensor:
    """[B, V] bool -> xgrammar layout [B, ceil(V / 32)] int32."""
    rows, vocab = allowed.shape
    padded = torch.zeros(rows, (vocab + 31) // 32 * 32, dtype=torch.int64)
    padded[:, :vocab] = allowed.long()
    words = (padded.view(rows, -1, 32) << torch.arange(32)).sum(dim=-1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_bitmask_is_respected(temperature):
    torch.manual_seed(4)
    vocab, rows = 70, 64
    sampler = make_sampler(vocab)
    logits = torch.randn(rows, vocab) * 4
    allowed = torch.rand(rows, vocab) < 0.1
    allowed[:, 3] = True
    params = [SamplingParams(temperature=temperature, seed=i) for i in range(rows)]
    result = sampler.sample(logits, prepare(sampler, params), _bitmask(allowed))
    assert allowed.gather(1, result.token_ids[:, None]).all()
    if temperature == 0.0:
        expected = logits.masked_fill(~allowed, float("-inf")).argmax(dim=-1)
        assert torch.equal(result.token_ids, expected)


def test_the_race_noise_is_finite_for_every_draw():
    """Every possible draw gives finite noise, so a token the mask set to -inf stays -inf
    and never wins the race (an infinite noise made it NaN, which argmax picks)."""
    noise = noise_from_bits(torch.arange(1 << UNIFORM_BITS, dtype=torch.int64))
    assert bool(torch.isfinite(noise).all())
    assert float(noise.min()) < -15 and float(noise.max()) > 2.7  # E from ~6e-8 to ~16.6
    assert bool((noise[1:] >= noise[:-1]).all())  # monotone in the draw: no ties broken oddly


def test_a_masked_row_draws_only_its_allowed_tokens_over_many_keys():
    vocab, rows = 4096, 4096
    x = torch.full((rows, vocab), float("-inf"))
    allowed = torch.randint(0, vocab, (rows, 2), generator=torch.Generator().manual_seed(3))
    x.scatter_(1, allowed, 0.0)
    keys = torch.arange(rows, dtype=torch.int64) * 2654435761 % (1 << 32)
    drawn = race(x, keys)
    assert bool((drawn[:, None] == allowed).any(dim=1).all())


# ---------------------------------------------------------------- reproducibility


def test_same_seed_and_position_give_the_same_token_in_any_batch():
    torch.manual_seed(5)
    vocab = 100
    sampler = make_sampler(vocab)
    row = torch.randn(vocab)
    target = SamplingParams(temperature=1.0, top_p=0.95, seed=1234)
    tokens = set()
    for trial in range(6):
        size = 1 + trial * 3
        others = [
            SamplingParams(temperature=random.Random(trial * 31 + j).choice([0.0, 0.5, 1.5]))
            for j in range(size)
        ]
        at = trial % (size + 1)
        params = [*others[:at], target, *others[at:]]
        logits = torch.randn(size + 1, vocab)
        logits[at] = row
        seeds = [trial * 100 + j for j in range(size + 1)]
        seeds[at] = 1234
        lens = [j for j in range(size + 1)]
        lens[at] = 17
        result = sampler.sample(logits, prepare(sampler, params, seeds=seeds, output_lens=lens))
        tokens.add(result.token_ids[at].item())
    assert len(tokens) == 1


def test_draws_vary_with_seed_and_position():
    vocab = 16
    sampler = make_sampler(vocab)
    logits = torch.zeros(200, vocab)  # uniform: every token equally likely
    params = [SamplingParams(temperature=1.0)] * 200
    by_position = sampler.sample(
        logits, prepare(sampler, params, seeds=[7] * 200, output_lens=list(range(200)))
    ).token_ids
    by_seed = sampler.sample(
        logits, prepare(sampler, params, seeds=list(range(200)), output_lens=[0] * 200)
    ).token_ids
    assert len(set(by_position.tolist())) == vocab
    assert len(set(by_seed.tolist())) == vocab


def test_full_64_bit_seeds_are_distinct():
    vocab = 1000
    sampler = make_sampler(vocab)
    logits = torch.zeros(4, vocab)
    seeds = [2**64 - 1, 2**63, 5, 5 + 2**32]  # the high halves must count
    params = [SamplingParams(temperature=1.0)] * 4
    tokens = sampler.sample(logits, prepare(sampler, params, seeds=seeds)).token_ids.tolist()
    assert len(set(tokens)) == 4


def test_hash_arithmetic_matches_python_integers():
    values = [0, 1, 2**16 - 1, 2**16, 2**31, 2**32 - 1, 123456789, 3735928559]
    x = torch.tensor(values, dtype=torch.int64)
    for c in (0x85EBCA6B, 0xC2B2AE35, 0x9E3779B9, 1, 0xFFFFFFFF):
        assert _mul32(x, c).tolist() == [(v * c) % 2**32 for v in values]

    def fmix32(h: int) -> int:
        h ^= h >> 16
        h = (h * 0x85EBCA6B) % 2**32
        h ^= h >> 13
        h = (h * 0xC2B2AE35) % 2**32
        return h ^ (h >> 16)

    assert _fmix32(x).tolist() == [fmix32(v) for v in values]


# ---------------------------------------------------------------- distribution

LOGITS8 = [2.0, 1.4, 1.1, 0.6, 0.2, -0.3, -0.9, -1.6]


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.6),
        SamplingParams(temperature=1.7, top_k=3),
        SamplingParams(temperature=1.0, top_p=0.8),
        SamplingParams(temperature=1.0, min_p=0.2),
        SamplingParams(temperature=1.3, top_k=6, top_p=0.9, min_p=0.05),
    ],
    ids=["plain", "cold", "top_k", "top_p", "min_p", "all"],
)
@pytest.mark.parametrize("max_candidates", [8, 2], ids=["sort", "candidates"])
def test_empirical_distribution_matches_filtered_softmax(params, max_candidates):
    draws, vocab = 20_000, len(LOGITS8)
    sampler = make_sampler(vocab, max_filter_candidates=max_candidates)
    permutation = [5, 2, 7, 0, 3, 6, 1, 4]  # so the best token is not token 0
    row = [0.0] * vocab
    for rank, token in enumerate(permutation):
        row[token] = LOGITS8[rank]
    expected = reference_probs(row, params)
    inputs = prepare(
        sampler,
        [params] * draws,
        seeds=[1_000_003 * i for i in range(draws)],
        output_lens=[i % 101 for i in range(draws)],
    )
    counts = torch.bincount(
        sampler.sample(torch.tensor([row] * draws), inputs).token_ids, minlength=vocab
    ).tolist()
    for token in range(vocab):
        if expected[token] == 0.0:
            assert counts[token] == 0, f"filtered token {token} was drawn"
    support = [t for t in range(vocab) if expected[t] > 0]
    chi2 = sum((counts[t] - draws * expected[t]) ** 2 / (draws * expected[t]) for t in support)
    assert chi2 < chi2_critical(len(support) - 1), (counts, expected)
    total_variation = 0.5 * sum(abs(counts[t] / draws - expected[t]) for t in range(vocab))
    assert total_variation < 0.02


def test_filter_among_candidates_equals_full_sort_and_reference():
    torch.manual_seed(8)
    rng = random.Random(8)
    vocab, rows = 300, 60
    params = [
        SamplingParams(
            top_k=rng.choice([-1, 1, 5, 50, 200]),
            top_p=rng.choice([1.0, 0.3, 0.9, 0.99]),
            min_p=rng.choice([0.0, 0.01, 0.3]),
        )
        for _ in range(rows)
    ]
    params[0] = SamplingParams()  # a row with no filter at all
    x = torch.randn(rows, vocab) * rng.choice([0.5, 3.0])
    top_k = torch.tensor([p.top_k if p.top_k > 0 else vocab for p in params])
    top_p = torch.tensor([p.top_p if p.top_p < 1 else math.inf for p in params])
    min_p = torch.tensor([p.min_p for p in params])
    full = x.clone()
    filter_logits(full, top_k, top_p, min_p, max_candidates=vocab)
    for i, p in enumerate(params):
        expected = torch.tensor(reference_probs(x[i].tolist(), p)) > 0
        assert torch.equal(torch.isfinite(full[i]), expected), i
    for max_candidates in (1, 8, 64):
        for args in ((top_k, top_p, min_p), (None, top_p, None), (top_k, None, min_p)):
            part, whole = x.clone(), x.clone()
            filter_logits(part, *args, max_candidates=max_candidates)
            filter_logits(whole, *args, max_candidates=vocab)
            assert torch.equal(part, whole), (max_candidates, [a is None for a in args])


def chi2_critical(dof: int, z: float = 4.75) -> float:
    """Wilson-Hilferty quantile of chi-square at upper tail ~1e-6."""
    if dof == 0:
        return 1e-9
    a = 2.0 / (9.0 * dof)
    return dof * (1.0 - a + z * math.sqrt(a)) ** 3


def test_uniforms_are_uniform_over_a_large_vocab():
    """Every token of a uniform distribution over 1024 tokens is hit about equally."""
    vocab, rows, chunks = 1024, 2048, 8
    sampler = make_sampler(vocab)
    params = [SamplingParams(temperature=1.0)] * rows
    counts = torch.zeros(vocab, dtype=torch.int64)
    for chunk in range(chunks):
        inputs = prepare(sampler, params, seeds=[chunk] * rows, output_lens=list(range(rows)))
        tokens = sampler.sample(torch.zeros(rows, vocab), inputs).token_ids
        counts += torch.bincount(tokens, minlength=vocab)
    expected = rows * chunks / vocab
    chi2 = float(((counts - expected) ** 2).sum() / expected)
    assert chi2 < chi2_critical(vocab - 1)


# ---------------------------------------------------------------- logprobs


def test_logprobs_are_raw_log_softmax():
    torch.manual_seed(6)
    vocab = 40
    sampler = make_sampler(vocab)
    params = [
        SamplingParams(temperature=0, logprobs=True, top_logprobs=5, repetition_penalty=1.8),
        SamplingParams(temperature=0.7, logprobs=True, seed=3),
        SamplingParams(
            temperature=1.0, top_k=4, logprobs=True, top_logprobs=2, frequency_penalty=1.5
        ),
        SamplingParams(temperature=1.2),
    ]
    logits = (torch.randn(4, vocab) * 2).to(torch.bfloat16)
    inputs = prepare(sampler, params, outputs=[[1, 2, 3]] * 4)
    result = sampler.sample(logits, inputs)
    reference = torch.log_softmax(logits.double(), dim=-1)
    chosen = reference.gather(1, result.token_ids[:, None]).squeeze(1)
    torch.testing.assert_close(result.logprobs.double(), chosen, rtol=0, atol=1e-5)
    assert result.top_ids.shape == (4, 5) and result.top_logprobs.dtype == torch.float32
    top = reference.topk(5, dim=-1)
    torch.testing.assert_close(result.top_logprobs.double(), top.values, rtol=0, atol=1e-5)
    assert torch.equal(result.top_ids, top.indices)


def test_logprobs_without_top_alternatives():
    sampler = make_sampler(10)
    logits = torch.randn(2, 10)
    params = [SamplingParams(temperature=0, logprobs=True), SamplingParams(temperature=0)]
    result = sampler.sample(logits, prepare(sampler, params))
    assert result.top_ids is None and result.top_logprobs is None
    expected = torch.log_softmax(logits, dim=-1).gather(1, result.token_ids[:, None])
    torch.testing.assert_close(result.logprobs, expected.squeeze(1))


# ---------------------------------------------------------------- bad input


def test_mismatched_rows_name_the_field():
    sampler = make_sampler(10)
    with pytest.raises(InvalidArgument, match="output_lens"):
        sampler.prepare([SamplingParams()] * 2, [0, 1], [0], [[], []], [[], []], [EOS])
    inputs = prepare(sampler, [SamplingParams()] * 2)
    with pytest.raises(InvalidArgument, match="logits"):
        sampler.sample(torch.zeros(3, 10), inputs)
    with pytest.raises(InvalidArgument, match="columns"):
        sampler.sample(torch.zeros(2, 9), inputs)


def test_token_ids_outside_the_vocab_are_ignored():
    sampler = make_sampler(10)
    params = [SamplingParams(temperature=0, min_tokens=2, stop_token_ids=(50,))]
    logits = torch.arange(10.0)[None, :]
    inputs = prepare(sampler, params, prompts=[[3, 30]], eos=(EOS, 1000))
    assert sampler.sample(logits, inputs).token_ids.tolist() == [9]
