"""Mistral's sliding window against Hugging Face transformers, past the window."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from radixmesh.errors import InvalidArgument
from radixmesh_kernels._triton import interpreting
from radixmesh_kernels.paged_attention import paged_attention_triton
from radixmesh_kernels.paged_decode_attention import paged_decode_attention_triton
from services.executor.core.forward_batch import BatchEntry, build_forward_batch
from services.executor.core.models import ARCHITECTURES, parse_spec
from services.executor.core.models.decoder import Decoder
from tests.fixtures.executor_driver import generate
from tests.unit.executor.conftest import (
    COMMON,
    MISTRAL_WINDOW,
    TinyModel,
    build_hf_model,
    greedy,
    hf_greedy,
    hf_logits,
    make_core,
    random_prompt,
    save_tiny_model,
)

WINDOW = MISTRAL_WINDOW


def _forward_all_rows(core, model: Decoder, entries: list[BatchEntry]) -> torch.Tensor:
    batch = build_forward_batch(entries, core.config.page_size, core.device)
    batch.logits_indices = torch.arange(batch.num_tokens)
    return model.forward(batch, core.kv_pool)


def test_hf_reference_applies_the_window(windowed_mistral: TinyModel) -> None:
    """The comparison below is meaningful: with the same weights and no window,
    transformers' logits differ from the first position past the window on."""
    tokens = random_prompt(20, seed=4)
    windowed = hf_logits(windowed_mistral.hf, tokens)
    full = hf_logits(build_hf_model("mistral-untied", sliding_window=None), tokens)
    torch.testing.assert_close(windowed[:WINDOW], full[:WINDOW])
    assert (windowed[WINDOW:] - full[WINDOW:]).abs().amax(dim=-1).min() > 1e-2


def _triton_attention(core) -> Decoder:
    """The core's decoder with the Triton attention kernels (interpreted on CPU)."""
    ops = dataclasses.replace(
        core.model.ops,
        paged_attention=paged_attention_triton,
        paged_decode_attention=paged_decode_attention_triton,
    )
    return Decoder(core.model.spec, core.model.weights, ops, core.info.max_model_len)


@pytest.mark.parametrize("attention", ["reference", "triton"])
def test_prefill_extend_and_decode_logits_match_transformers(
    windowed_mistral: TinyModel, attention: str
) -> None:
    """A prefill shorter than the window, an extend over a prefix past it, then
    decodes one token at a time: every row against transformers' whole-sequence run."""
    if attention == "triton" and not (interpreting() or torch.cuda.is_available()):
        pytest.skip("Triton needs a CUDA device or TRITON_INTERPRET=1")
    core = make_core(windowed_mistral)
    model = _triton_attention(core) if attention == "triton" else core.model
    tokens = random_prompt(30, seed=5)
    pages = list(range(8))  # page_size 4: room for 32 positions
    steps = [(0, 6), (6, 23)] + [(n, n + 1) for n in range(23, 30)]
    rows = [
        _forward_all_rows(core, model, [BatchEntry(start, tokens[start:end], pages, True)])
        for start, end in steps
    ]
    ours = torch.cat(rows)
    torch.testing.assert_close(ours, hf_logits(windowed_mistral.hf, tokens), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("max_num_batched_tokens", [8192, 5])
def test_greedy_past_the_window_matches_transformers_generate(
    windowed_mistral: TinyModel, max_num_batched_tokens: int
) -> None:
    """Prompts longer and shorter than the window, 24 greedy tokens each; with a
    small budget the prompts are prefilled in chunks beside running decodes."""
    core = make_core(windowed_mistral, max_num_batched_tokens=max_num_batched_tokens)
    prompts = [random_prompt(13, seed=6), random_prompt(3, seed=7)]
    outputs = generate(core, prompts, greedy(24, ignore_eos=True))
    for prompt, output in zip(prompts, outputs, strict=True):
        assert output.token_ids == hf_greedy(windowed_mistral.hf, prompt, 24, ignore_eos=True)
        assert len(output.token_ids) == 24


def test_max_model_len_is_not_capped_at_the_window(tmp_path: Path) -> None:
    config = {**COMMON, "sliding_window": 16, "max_position_embeddings": 256}
    spec = parse_spec(config, "MistralForCausalLM", ARCHITECTURES["MistralForCausalLM"])
    assert (spec.sliding_window, spec.max_position_embeddings) == (16, 256)
    core = make_core(save_tiny_model(tmp_path, "mistral-untied", sliding_window=16))
    assert core.info.max_model_len == 256
    assert core.model.spec.sliding_window == 16


def test_window_applies_only_where_the_architecture_honours_it() -> None:
    config = {**COMMON, "sliding_window": 16}
    assert (
        parse_spec(config, "LlamaForCausalLM", ARCHITECTURES["LlamaForCausalLM"]).sliding_window
        is None
    )
    mistral = ARCHITECTURES["MistralForCausalLM"]
    assert (
        parse_spec({**COMMON, "sliding_window": None}, "MistralForCausalLM", mistral).sliding_window
        is None
    )


@pytest.mark.parametrize("window", [0, -4, 2.5, "8"])
def test_bad_window_in_config_names_the_field(window) -> None:
    mistral = ARCHITECTURES["MistralForCausalLM"]
    with pytest.raises(InvalidArgument, match="sliding_window"):
        parse_spec({**COMMON, "sliding_window": window}, "MistralForCausalLM", mistral)
