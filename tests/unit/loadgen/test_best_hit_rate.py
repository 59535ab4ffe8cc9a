"""bench/best_hit_rate.py: the most of a run's prompt tokens a prefix cache could serve."""

from __future__ import annotations

import importlib
import os
import random

import pytest

from gateway.core.tokenizer import Tokenizer
from mesh.loadgen.workloads import WorkloadConfig
from mesh.tiny_model import ensure_default_model

best = importlib.import_module("bench.best_hit_rate")


def brute_force(prompts: list[list[int]]) -> float:
    def common(a: list[int], b: list[int]) -> int:
        return next(
            (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
        )

    hit = sum(
        min(max((common(p, q) for q in prompts[:i]), default=0), len(p) - 1)
        for i, p in enumerate(prompts)
    )
    return hit / sum(map(len, prompts))


def test_it_is_each_prompt_s_longest_prefix_an_earlier_one_shares():
    rng = random.Random(int(os.environ.get("TEST_SEED", "0")))
    stems = [[rng.randrange(4) for _ in range(rng.randrange(1, 12))] for _ in range(5)]
    prompts = [
        rng.choice(stems)[: rng.randrange(1, 13)]
        + [rng.randrange(4) for _ in range(rng.randrange(4))]
        for _ in range(40)
    ]
    prompts = [p for p in prompts if p]
    assert best.best_hit_rate(prompts) == brute_force(prompts)
    assert best.best_hit_rate([[1, 2, 3], [1, 2, 3]]) == 2 / 6  # the last token is computed
    assert best.best_hit_rate([[1, 2], [3, 4]]) == 0.0
    # a warm-up's prompts were sent first: cached, not counted
    assert best.best_hit_rate([[3, 4, 5]], cached=[[3, 4, 9]]) == 2 / 3
    assert best.best_hit_rate(prompts[5:], cached=prompts[:5]) == pytest.approx(
        (
            brute_force(prompts) * sum(map(len, prompts))
            - brute_force(prompts[:5]) * sum(map(len, prompts[:5]))
        )
        / sum(map(len, prompts[5:]))
    )


def test_the_bench_s_shared_prefix_groups_share_their_system_prompt():
    tokenizer = Tokenizer.from_folder(ensure_default_model())
    config = WorkloadConfig(
        name="shared-prefix", groups=2, prompts_per_group=4, system_prompt_len=40, question_len=8
    )
    prompts = best.bench_prompts(tokenizer, config, 8)
    rate = best.best_hit_rate(prompts)
    # six of eight prompts find their group's system prompt (about 40 of 50-odd words) cached
    assert 0.5 < rate < 6 / 8
    assert rate == brute_force(prompts)
