"""On a CUDA device: Triton kernels and decode graphs give transformers' greedy tokens."""

from __future__ import annotations

import pytest
import torch

from tests.fixtures.executor_driver import generate
from tests.unit.executor.conftest import (
    TinyModel,
    greedy,
    hf_greedy,
    make_core,
    random_prompt,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("cuda_graphs", [True, False])
def test_greedy_batch_on_cuda_matches_transformers(
    tiny_model: TinyModel, cuda_graphs: bool
) -> None:
    core = make_core(
        tiny_model, device="cuda", dtype="float32", cuda_graphs=cuda_graphs, max_num_seqs=8
    )
    assert (core.forward.decode is not None) == cuda_graphs
    prompts = [random_prompt(n, seed=70 + n) for n in (5, 21, 12)]  # 3 rows pad to bucket 4
    outputs = generate(core, prompts, greedy(24))
    for prompt, output in zip(prompts, outputs, strict=True):
        assert output.token_ids == hf_greedy(tiny_model.hf, prompt, 24)


def test_graph_padding_writes_only_the_scratch_page(llama_model: TinyModel) -> None:
    core = make_core(llama_model, device="cuda", dtype="float32", max_num_seqs=8)
    scratch = core.kv_pool.scratch_page_ids
    assert scratch == [core.info.num_pages]
    before = [k[: core.info.num_pages].clone() for k in core.kv_pool.k_caches]
    prompts = [random_prompt(6, seed=80 + i) for i in range(3)]  # decodes pad 3 rows to 4
    outputs = generate(core, prompts, greedy(3, ignore_eos=True))
    pages_used = 3 * -(-(6 + 3) // core.config.page_size)  # the driver hands out 0, 1, ...
    for layer, k in enumerate(core.kv_pool.k_caches):
        assert torch.equal(k[pages_used : core.info.num_pages], before[layer][pages_used:])
    assert [len(o.token_ids) for o in outputs] == [3, 3, 3]


@pytest.mark.parametrize("cuda_graphs", [True, False])
def test_sliding_window_past_the_window_on_cuda_matches_transformers(
    windowed_mistral: TinyModel, cuda_graphs: bool
) -> None:
    """Prompts longer and shorter than the window, decodes far past it (the windowed
    prefill and decode kernels, in and out of graphs)."""
    model = windowed_mistral
    core = make_core(model, device="cuda", dtype="float32", cuda_graphs=cuda_graphs, max_num_seqs=8)
    prompts = [random_prompt(13, seed=6), random_prompt(3, seed=7), random_prompt(40, seed=8)]
    outputs = generate(core, prompts, greedy(24, ignore_eos=True))
    for prompt, output in zip(prompts, outputs, strict=True):
        assert output.token_ids == hf_greedy(model.hf, prompt, 24, ignore_eos=True)
