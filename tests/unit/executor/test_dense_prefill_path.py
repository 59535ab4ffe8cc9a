"""The decoder hands a dense-K/V prefill kernel the new tokens' rotated keys and values."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch

from radixmesh_kernels._triton import interpreting
from radixmesh_kernels.paged_decode_attention import paged_decode_attention_triton
from radixmesh_kernels.prefill_attention import prefill_attention_triton
from services.executor.core.forward_batch import BatchEntry, build_forward_batch
from services.executor.core.models.decoder import Decoder
from tests.unit.executor.conftest import TinyModel, hf_logits, make_core, random_prompt


@pytest.mark.parametrize("min_dense_q_len", [1, 10])
def test_prefill_extend_and_decode_through_the_dense_kernel_match_transformers(
    llama_model: TinyModel, min_dense_q_len: int
) -> None:
    """A prompt from position 0 and extends over a cached prefix take the dense kernel
    (k_new / v_new given, the fused rotary + store replaced by the two ops) when they run at
    least the op's min_dense_q_len new tokens, decodes the decode kernel; every row against
    transformers' whole-sequence run."""
    if not (interpreting() or torch.cuda.is_available()):
        pytest.skip("Triton needs a CUDA device or TRITON_INTERPRET=1")
    core = make_core(llama_model)
    calls: list[bool] = []

    def spy(*args, **kwargs):
        calls.append(kwargs.get("k_new") is not None and kwargs.get("v_new") is not None)
        return prefill_attention_triton(*args, **kwargs)

    spy.__signature__ = inspect.signature(prefill_attention_triton)  # type: ignore[attr-defined]
    spy.min_dense_q_len = min_dense_q_len  # type: ignore[attr-defined]
    ops = dataclasses.replace(
        core.model.ops, paged_attention=spy, paged_decode_attention=paged_decode_attention_triton
    )
    model = Decoder(core.model.spec, core.model.weights, ops, core.info.max_model_len)
    tokens = random_prompt(26, seed=11)
    pages = list(range(8))
    rows = []
    for start, end in [(0, 9), (9, 23), (23, 24), (24, 26)]:
        entries = [BatchEntry(start, tokens[start:end], pages, True)]
        batch = build_forward_batch(entries, core.config.page_size, core.device)
        batch.logits_indices = torch.arange(batch.num_tokens)
        rows.append(model.forward(batch, core.kv_pool))
    # every layer of the three non-decode steps (a two-token extend is not a decode): 9, 14
    # and 2 new tokens
    dense = [q_len >= min_dense_q_len for q_len in (9, 14, 2)]
    assert calls == [d for d in dense for _ in range(core.model.spec.num_layers)]
    torch.testing.assert_close(
        torch.cat(rows), hf_logits(llama_model.hf, tokens), atol=1e-4, rtol=1e-4
    )
