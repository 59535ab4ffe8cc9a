"""One forward over a mixed batch equals each sequence run alone (Hugging Face as reference)."""

from __future__ import annotations

import torch

from services.executor.core.forward_batch import BatchEntry, build_forward_batch
from tests.unit.executor.conftest import TinyModel, hf_logits, make_core, random_prompt

TOL = {"atol": 1e-4, "rtol": 1e-4}


def run_rows(core, entries: list[BatchEntry]) -> list[torch.Tensor]:
    """Logits of every token, split per entry."""
    batch = build_forward_batch(entries, core.config.page_size, core.device)
    batch.logits_indices = torch.arange(batch.num_tokens)
    logits = core.model.forward(batch, core.kv_pool)
    return list(logits.split([len(e.token_ids) for e in entries]))


def test_extends_over_shared_prefix_pages_mixed_with_prefill_and_decode(
    tiny_model: TinyModel,
) -> None:
    core = make_core(tiny_model)  # page_size 4
    prefix = random_prompt(16, seed=20)  # four full pages: 0..3
    prefix_pages = [0, 1, 2, 3]
    tails = {"a": random_prompt(7, seed=21), "b": random_prompt(5, seed=22)}
    lone = random_prompt(9, seed=23)  # prefilled earlier, decodes in the mixed batch
    fresh = random_prompt(11, seed=24)  # a plain prefill in the mixed batch
    lone_pages, fresh_pages = [10, 11, 12], [13, 14, 15]
    pages = {"a": [*prefix_pages, 4, 5], "b": [*prefix_pages, 6, 7]}

    run_rows(core, [BatchEntry(0, prefix, prefix_pages, True)])
    run_rows(core, [BatchEntry(0, lone[:-1], lone_pages, True)])
    mixed = run_rows(
        core,
        [
            BatchEntry(16, tails["a"], pages["a"], True),
            BatchEntry(8, lone[-1:], lone_pages, True),
            BatchEntry(0, fresh, fresh_pages, True),
            BatchEntry(16, tails["b"], pages["b"], True),
        ],
    )
    hf = tiny_model.hf
    torch.testing.assert_close(mixed[0], hf_logits(hf, prefix + tails["a"])[16:], **TOL)
    torch.testing.assert_close(mixed[1], hf_logits(hf, lone)[-1:], **TOL)
    torch.testing.assert_close(mixed[2], hf_logits(hf, fresh), **TOL)
    torch.testing.assert_close(mixed[3], hf_logits(hf, prefix + tails["b"])[16:], **TOL)


def test_chunked_prefill_equals_unchunked(llama_model: TinyModel) -> None:
    core = make_core(llama_model, page_size=8)
    prompt = random_prompt(30, seed=30)
    pages = [0, 1, 2, 3]
    whole = run_rows(core, [BatchEntry(0, prompt, pages, True)])[0]
    chunks = []
    for start, end in ((0, 7), (7, 20), (20, 30)):  # chunk borders off the page borders
        chunks += run_rows(core, [BatchEntry(start, prompt[start:end], [4, 5, 6, 7], True)])
    torch.testing.assert_close(torch.cat(chunks), whole, **TOL)
    torch.testing.assert_close(whole, hf_logits(llama_model.hf, prompt), **TOL)
