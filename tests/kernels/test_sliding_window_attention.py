"""Sliding-window paged attention: references against dense masked attention,
Triton prefill/extend and split-KV decode against the references.

Triton runs on a copy of the batch whose keys and values below every query's
window are NaN, so a kernel that reads a position it should skip (or fails
to mask one at the window's edge) produces NaN.
"""

from __future__ import annotations

import pytest
import torch
from kernel_factories import PagedBatch, make_paged_batch, tolerance

from radixmesh_kernels.paged_attention import paged_attention_ref, paged_attention_triton
from radixmesh_kernels.paged_decode_attention import (
    paged_decode_attention_ref,
    paged_decode_attention_triton,
)

# (q_len, seq_len): a fresh prefill, an extend over a prefix longer than most
# windows, a single-token extend, a sequence with nothing scheduled, a
# prefill spanning two query blocks and an extend spanning three.
MIXED = [(7, 7), (5, 38), (1, 20), (0, 9), (21, 21), (40, 75)]


def _batch(pairs, *, group, page_size, dtype, seed, num_kv_heads=2, head_dim=32) -> PagedBatch:
    q_lens, seq_lens = zip(*pairs, strict=True)
    return make_paged_batch(
        list(q_lens), list(seq_lens), num_kv_heads=num_kv_heads, group=group,
        head_dim=head_dim, page_size=page_size, dtype=dtype, seed=seed,
    )  # fmt: skip


def _slots(batch: PagedBatch, seq: int, positions: torch.Tensor) -> torch.Tensor:
    page_size = batch.k_cache.shape[1]
    positions = positions.to(batch.page_table.device)
    pages = batch.page_table[seq, positions // page_size].long()
    return pages * page_size + positions % page_size


def _poison_outside_windows(batch: PagedBatch, window: int) -> PagedBatch:
    """A copy with NaN keys and values at every position no query of its sequence sees."""
    k_cache, v_cache = batch.k_cache.clone(), batch.v_cache.clone()
    q_lens = (batch.cu_seqlens_q[1:] - batch.cu_seqlens_q[:-1]).tolist()
    for seq, (q_len, seq_len) in enumerate(zip(q_lens, batch.seq_lens.tolist(), strict=True)):
        first_visible = max(seq_len - q_len - window + 1, 0)
        slots = _slots(batch, seq, torch.arange(first_visible))
        for cache in (k_cache, v_cache):
            cache.view(-1, *cache.shape[2:])[slots] = float("nan")
    return PagedBatch(
        k_cache, v_cache, batch.page_table, batch.seq_lens, batch.cu_seqlens_q, batch.q, batch.scale
    )


def _prefill(batch: PagedBatch, fn, window: int | None, **kwargs) -> torch.Tensor:
    args = (batch.q, batch.k_cache, batch.v_cache, batch.page_table, batch.cu_seqlens_q)
    return fn(*args, batch.seq_lens, batch.scale, window, **kwargs)


def _decode(batch: PagedBatch, fn, window: int | None, **kwargs) -> torch.Tensor:
    args = (batch.q, batch.k_cache, batch.v_cache, batch.page_table, batch.seq_lens, batch.scale)
    return fn(*args, window, **kwargs)


def _dense_windowed(batch: PagedBatch, window: int) -> torch.Tensor:
    """Float64 attention of each query row over exactly the keys in its window."""
    out = torch.zeros(batch.q.shape, dtype=torch.float64, device=batch.q.device)
    num_heads, num_kv_heads = batch.q.shape[1], batch.k_cache.shape[2]
    keys = batch.k_cache.reshape(-1, *batch.k_cache.shape[2:]).double()
    values = batch.v_cache.reshape(-1, *batch.v_cache.shape[2:]).double()
    starts = batch.cu_seqlens_q.tolist()
    for seq, seq_len in enumerate(batch.seq_lens.tolist()):
        q_len = starts[seq + 1] - starts[seq]
        for i in range(q_len):
            row, pos = starts[seq] + i, seq_len - q_len + i
            slots = _slots(batch, seq, torch.arange(max(pos - window + 1, 0), pos + 1))
            k = keys[slots].repeat_interleave(num_heads // num_kv_heads, dim=1)
            v = values[slots].repeat_interleave(num_heads // num_kv_heads, dim=1)
            scores = torch.einsum("hd,nhd->hn", batch.q[row].double(), k) * batch.scale
            out[row] = torch.einsum("hn,nhd->hd", scores.softmax(dim=-1), v)
    return out


@pytest.mark.parametrize("window", [1, 6, 16, 1000])
def test_references_match_dense_windowed_attention(window):
    batch = _batch(MIXED, group=2, page_size=4, dtype=torch.float64, seed=window)
    dense = _dense_windowed(batch, window)
    torch.testing.assert_close(
        _prefill(batch, paged_attention_ref, window), dense, atol=1e-5, rtol=1e-5
    )
    decode = _batch([(1, n) for n in (1, 5, 33)], group=2, page_size=4, dtype=torch.float64, seed=1)
    torch.testing.assert_close(
        _decode(decode, paged_decode_attention_ref, window),
        _dense_windowed(decode, window),
        atol=1e-5,
        rtol=1e-5,
    )


def test_window_changes_only_rows_that_reach_past_it():
    """Rows at positions < window see the whole prefix: same output as full attention."""
    batch = _batch([(30, 30)], group=1, page_size=16, dtype=torch.float32, seed=2)
    windowed = _prefill(batch, paged_attention_ref, 10)
    full = _prefill(batch, paged_attention_ref, None)
    torch.testing.assert_close(windowed[:10], full[:10])
    assert not torch.isclose(windowed[10:], full[10:], atol=1e-3).all(dim=-1).any()


# (window, page_size, group, dtype): a window of one position, one smaller than
# a page and not a multiple of the block, one a multiple of the block, one
# past three blocks, one longer than every sequence.
PREFILL_CASES = [
    (1, 16, 4, torch.float32),
    (5, 16, 1, torch.float32),
    (5, 1, 4, torch.float32),
    (16, 1, 8, torch.float32),
    (37, 16, 4, torch.bfloat16),
    (1000, 1, 1, torch.float32),
]


@pytest.mark.parametrize("pack_gqa", [False, True])
@pytest.mark.parametrize(("window", "page_size", "group", "dtype"), PREFILL_CASES)
def test_triton_prefill_and_extend_match_reference(window, page_size, group, dtype, pack_gqa):
    batch = _batch(
        MIXED, num_kv_heads=1 if group == 8 else 2, group=group, page_size=page_size,
        dtype=dtype, seed=window + group,
    )  # fmt: skip
    ref = _prefill(batch, paged_attention_ref, window)
    poisoned = _poison_outside_windows(batch, window)
    out = _prefill(poisoned, paged_attention_triton, window, pack_gqa=pack_gqa)
    assert not out.isnan().any()
    torch.testing.assert_close(out, ref, **tolerance(dtype))


# (window, num_splits): several splits over a window inside a long context, one
# split, more splits than the window fills, a window of one, one past every
# sequence, and the default split count (sized by the window).
DECODE_CASES = [(100, 4), (100, 1), (7, 8), (1, 3), (1000, 2), (300, None)]


@pytest.mark.parametrize(("window", "num_splits"), DECODE_CASES)
def test_triton_decode_matches_reference(window, num_splits):
    batch = _batch(
        [(1, n) for n in (1, 15, 45, 70, 700)], group=4, page_size=16, dtype=torch.float32,
        seed=window,
    )  # fmt: skip
    ref = _decode(batch, paged_decode_attention_ref, window)
    poisoned = _poison_outside_windows(batch, window)
    out = _decode(poisoned, paged_decode_attention_triton, window, num_splits=num_splits)
    assert not out.isnan().any()
    torch.testing.assert_close(out, ref, **tolerance(torch.float32))


@pytest.mark.parametrize("page_size", [1, 16])
def test_triton_decode_gqa_and_padding_row(page_size):
    """GQA 8 in bf16, with a padding row (seq_len 0) that must stay zeros."""
    batch = _batch(
        [(1, 50), (1, 0), (1, 9)], num_kv_heads=1, group=8, page_size=page_size,
        dtype=torch.bfloat16, seed=page_size,
    )  # fmt: skip
    ref = _decode(batch, paged_decode_attention_ref, 20)
    out = _decode(_poison_outside_windows(batch, 20), paged_decode_attention_triton, 20)
    torch.testing.assert_close(out[[0, 2]], ref[[0, 2]], **tolerance(torch.bfloat16))
    assert torch.equal(out[1], torch.zeros_like(out[1]))


@pytest.mark.parametrize("window", [0, -3, True, 2.5])
@pytest.mark.parametrize(
    ("op", "run"),
    [
        ("paged_attention", lambda b, w: _prefill(b, paged_attention_triton, w)),
        ("paged_attention", lambda b, w: _prefill(b, paged_attention_ref, w)),
        ("paged_decode_attention", lambda b, w: _decode(b, paged_decode_attention_triton, w)),
        ("paged_decode_attention", lambda b, w: _decode(b, paged_decode_attention_ref, w)),
    ],
)
def test_bad_window_is_refused_by_name(op, run, window):
    batch = _batch([(1, 3)], group=1, page_size=16, dtype=torch.float32, seed=0)
    with pytest.raises(ValueError, match=f"{op}: sliding_window"):
        run(batch, window)
