"""Start-up warm-up: prefill forwards on dummy inputs, so that requests do not pay the
kernels' compilation and tuning (decode is warmed by capturing its CUDA graphs)."""

from __future__ import annotations

import itertools

import torch

from services.executor.core.forward_batch import ForwardBatch
from services.executor.core.kv_pool import KVPool
from services.executor.core.models.decoder import Decoder


def warm_prefill(model: Decoder, kv_pool: KVPool, num_tokens: int, page_id: int) -> None:
    """Prefill forwards on dummy inputs, so that requests do not pay the kernels'
    compilation and tuning.

    First a large batch (a prompt from position 0 and an extension of a cached
    prefix, `num_tokens` new tokens together): tuned kernels keep the
    configuration chosen on their first call, and the prefills that matter are
    large. Then two small ones, so that every class of page-table width the
    compiler specializes integers on (one, a multiple of 16, any other) is
    compiled. Every key and value goes to `page_id`, which no request may hold
    yet (this runs before serving). No position reaches past the model's
    rotary table (its max_model_len).
    """
    page_size = kv_pool.page_size
    max_positions = model.cos_sin_cache.shape[0]
    num_tokens = max(2, min(num_tokens, max_positions))
    first = num_tokens // 2
    second = num_tokens - first
    big = [(first, 0), (second, min(2 * page_size, max_positions - second))]
    for seqs, min_width in ((big, 16), ([(1, 0)], 1), ([(1, 0)], 3)):
        model.forward(_dummy_prefill(kv_pool, seqs, min_width, page_id), kv_pool)
    device = kv_pool.k_caches[0].device
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _dummy_prefill(
    kv_pool: KVPool, seqs: list[tuple[int, int]], min_width: int, page_id: int
) -> ForwardBatch:
    """(new tokens, cached prefix) per sequence; the page table is `min_width` wide, or
    the next multiple of it that holds the longest sequence, every entry `page_id`."""
    device = kv_pool.k_caches[0].device
    page_size = kv_pool.page_size
    q_lens = [q for q, _ in seqs]
    seq_lens = [q + prefix for q, prefix in seqs]
    positions = torch.cat([torch.arange(p, s) for (_, p), s in zip(seqs, seq_lens, strict=True)])
    width = -(-max(seq_lens) // page_size)
    width = -(-width // min_width) * min_width
    cu_seqlens = torch.tensor([0, *itertools.accumulate(q_lens)], dtype=torch.int32)
    return ForwardBatch(
        input_ids=torch.zeros(sum(q_lens), dtype=torch.int64, device=device),
        positions=positions.to(device),
        cu_seqlens_q=cu_seqlens.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        page_table=torch.full((len(seqs), width), page_id, dtype=torch.int32, device=device),
        slot_mapping=(page_id * page_size + positions % page_size).to(device),
        logits_indices=(cu_seqlens[1:] - 1).to(torch.int64).to(device),
        is_decode=False,
        max_q_len=max(q_lens),
    )
