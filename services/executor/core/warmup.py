"""Start-up warm-up: the prefill attention's per-shape choices, then prefill forwards on
dummy inputs, so that requests do not pay the kernels' compilation and tuning (decode is
warmed by capturing its CUDA graphs)."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import torch

from radixmesh_kernels import prefill_attention
from radixmesh_kernels.paged_attention import packed_warmup_q_lens, paged_attention_triton
from services.common.logging import get_logger
from services.executor.core.forward_batch import ForwardBatch
from services.executor.core.kv_pool import KVPool
from services.executor.core.models.decoder import Decoder

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class PrefillChoice:
    """What the start-up decided for the prefill attention: plan name per bucket."""

    buckets: tuple[int, ...]
    chosen: dict[int, str]
    seconds: float


def decide_prefill_attention(model: Decoder, kv_pool: KVPool, max_q_len: int) -> PrefillChoice:
    """Every prefill attention choice a step of up to `max_q_len` new tokens in one
    sequence can need, made now: the buckets of `prefill_attention.startup_buckets`, timed
    on this model's shape (this rank's heads). From then on a serving step times and
    compiles nothing for it (an undecided shape takes the nearest bucket's plan or the
    paged kernel). Nothing to decide where the model does not run the Triton prefill
    kernel, has a sliding window, or keeps its cache in another dtype than it computes in.
    Logged as `prefill_attention_choice`."""
    start = time.perf_counter()
    spec, k_cache = model.spec, kv_pool.k_caches[0]
    uses_dense = (
        model.ops.paged_attention is prefill_attention.prefill_attention_triton
        and spec.sliding_window is None
        and k_cache.dtype == model.weights.embed.dtype
    )
    buckets = prefill_attention.startup_buckets(max_q_len) if uses_dense else ()
    shape = prefill_attention.ShapeClass(
        k_cache.device, k_cache.dtype, spec.num_heads, spec.num_kv_heads, spec.head_dim,
        kv_pool.page_size,
    )  # fmt: skip
    plans = prefill_attention.decide_plans(shape, buckets)  # none: still no timing later
    if k_cache.device.type == "cuda":  # the timing cases' blocks, before graphs are sized
        torch.cuda.empty_cache()
    choice = PrefillChoice(
        buckets, {b: plan.name for b, plan in plans.items()}, time.perf_counter() - start
    )
    log.info(
        "prefill_attention_choice", mode=prefill_attention.MODE, buckets=list(buckets),
        chosen={str(b): name for b, name in choice.chosen.items()},
        seconds=round(choice.seconds, 3),
    )  # fmt: skip
    return choice


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
    warm_paged_attention(model, kv_pool, page_id)
    device = kv_pool.k_caches[0].device
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def width_classes(pages: int) -> tuple[int, ...]:
    """A page-table width at least `pages` of each class the compiler specializes an integer
    on: one (where the pages are one), any other, a multiple of 16."""
    other = max(pages, 2) + (max(pages, 2) % 16 == 0)
    return (*((1,) if pages == 1 else ()), other, -(-pages // 16) * 16)


def warm_paged_attention(model: Decoder, kv_pool: KVPool, page_id: int) -> list[tuple[int, bool, int]]:
    """Both forms of the Triton paged prefill kernel, launched once in every page-table
    width class: one head a program (its tiles tuned on this first call, a one-token
    prompt as before), and packed grouped-query heads in each tile height a step can pick
    (`packed_warmup_q_lens`). Steps reach the two forms by their length and their
    number of sequences (`packs_by_default`), and a forward of the model may run the dense
    kernel instead, so the kernel is called directly. Returns (new tokens, packed, width)
    of each launch; none where the model does not run the Triton prefill kernel."""
    if model.ops.paged_attention not in (
        prefill_attention.prefill_attention_triton, paged_attention_triton
    ):
        return []
    spec = model.spec
    k_cache, v_cache = kv_pool.k_caches[0], kv_pool.v_caches[0]
    dtype = model.weights.embed.dtype
    launches = [(1, False)] + [(q, True) for q in packed_warmup_q_lens(spec.num_heads // spec.num_kv_heads)]
    done = []
    for q_len, packed in launches:
        for width in width_classes(-(-q_len // kv_pool.page_size)):
            batch = _dummy_prefill(kv_pool, [(q_len, 0)], width, page_id)
            q = torch.zeros((q_len, spec.num_heads, spec.head_dim), dtype=dtype, device=k_cache.device)
            paged_attention_triton(
                q, k_cache, v_cache, batch.page_table, batch.cu_seqlens_q, batch.seq_lens,
                model.scale, spec.sliding_window, q_len, pack_gqa=packed,
            )  # fmt: skip
            done.append((q_len, packed, batch.page_table.shape[1]))
    return done


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
