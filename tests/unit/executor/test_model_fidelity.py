"""The decoder against Hugging Face transformers: logits and greedy continuations."""

from __future__ import annotations

import pytest
import torch

from services.executor.core.forward_batch import BatchEntry, build_forward_batch
from tests.fixtures.executor_driver import generate
from tests.unit.executor.conftest import (
    TinyModel,
    greedy,
    hf_greedy,
    hf_logits,
    make_core,
    random_prompt,
)


def all_row_logits(core, entries: list[BatchEntry]) -> torch.Tensor:
    """Our logits for every token of the batch (not only the sampled rows)."""
    batch = build_forward_batch(entries, core.config.page_size, core.device)
    batch.logits_indices = torch.arange(batch.num_tokens)
    return core.model.forward(batch, core.kv_pool)


def test_prefill_logits_match_transformers(tiny_model: TinyModel) -> None:
    core = make_core(tiny_model)
    prompt = random_prompt(45, seed=1)
    ours = all_row_logits(core, [BatchEntry(0, prompt, list(range(12)), True)])
    torch.testing.assert_close(ours, hf_logits(tiny_model.hf, prompt), atol=1e-4, rtol=1e-4)


def test_greedy_continuation_matches_transformers_generate(tiny_model: TinyModel) -> None:
    core = make_core(tiny_model)
    prompt = random_prompt(13, seed=2)
    (output,) = generate(core, [prompt], greedy(32))
    expected = hf_greedy(tiny_model.hf, prompt, 32)
    assert output.token_ids == expected
    assert output.finish_reason == ("length" if len(expected) == 32 else "stop")


@pytest.mark.parametrize("max_num_batched_tokens", [8192, 7])
def test_batched_greedy_equals_each_prompt_alone(
    llama_model: TinyModel, max_num_batched_tokens: int
) -> None:
    """Several prompts decoded together (and, with a small budget, prefilled in chunks)."""
    core = make_core(llama_model, max_num_batched_tokens=max_num_batched_tokens)
    prompts = [random_prompt(n, seed=10 + n) for n in (3, 17, 9)]
    outputs = generate(core, prompts, greedy(12, ignore_eos=True))
    for prompt, output in zip(prompts, outputs, strict=True):
        assert output.prompt_token_ids == prompt
        with torch.no_grad():
            ids = llama_model.hf.generate(
                torch.tensor([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                max_new_tokens=12,
                min_new_tokens=12,
                do_sample=False,
                eos_token_id=None,
            )
        assert output.token_ids == ids[0, len(prompt) :].tolist()
        assert output.finish_reason == "length"


def test_repetition_penalty_sees_prompt_and_outputs_like_transformers(
    llama_model: TinyModel,
) -> None:
    core = make_core(llama_model)
    prompt = random_prompt(6, seed=3)
    (output,) = generate(core, [prompt], greedy(16, repetition_penalty=1.5, ignore_eos=True))
    with torch.no_grad():
        ids = llama_model.hf.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=16,
            do_sample=False,
            repetition_penalty=1.5,
            eos_token_id=None,
        )
    assert output.token_ids == ids[0, len(prompt) :].tolist()
