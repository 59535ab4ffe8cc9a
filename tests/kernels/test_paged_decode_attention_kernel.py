"""Triton split-KV paged decode attention against the torch reference."""

from __future__ import annotations

import pytest
import torch
from kernel_factories import make_paged_batch, tolerance

from radixmesh_kernels.paged_decode_attention import (
    default_num_splits,
    paged_decode_attention_ref,
    paged_decode_attention_triton,
)
from radixmesh_kernels.tuning import graphed

# context lengths: one token, one short of a tile, several tiles and pages
SEQ_LENS = [1, 15, 45, 70]


def _run(seq_lens, *, group, head_dim, page_size, dtype, seed, num_kv_heads=2, **kwargs):
    batch = make_paged_batch(
        [1] * len(seq_lens), seq_lens, num_kv_heads=num_kv_heads, group=group,
        head_dim=head_dim, page_size=page_size, dtype=dtype, seed=seed,
    )  # fmt: skip
    args = (batch.q, batch.k_cache, batch.v_cache, batch.page_table, batch.seq_lens, batch.scale)
    return paged_decode_attention_triton(*args, **kwargs), paged_decode_attention_ref(*args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("head_dim", [64, 80, 128])
def test_gqa_decode_matches_reference(head_dim, group, page_size, dtype):
    out, ref = _run(
        SEQ_LENS, group=group, head_dim=head_dim, page_size=page_size, dtype=dtype,
        seed=head_dim * group + page_size, num_splits=2,
    )  # fmt: skip
    assert not out.isnan().any()
    torch.testing.assert_close(out, ref, **tolerance(dtype))


@pytest.mark.parametrize("num_splits", [1, 3, 8])
def test_any_split_count_gives_the_reference(num_splits):
    """8 splits of a 70-token context leave trailing splits empty."""
    out, ref = _run(
        SEQ_LENS,
        group=4,
        head_dim=64,
        page_size=16,
        dtype=torch.float32,
        seed=5,
        num_splits=num_splits,
    )
    torch.testing.assert_close(out, ref, **tolerance(torch.float32))


def test_default_split_count_matches_reference():
    out, ref = _run([300, 2], group=2, head_dim=64, page_size=16, dtype=torch.bfloat16, seed=6)
    torch.testing.assert_close(out, ref, **tolerance(torch.bfloat16))


def test_padding_row_with_no_context_gives_zeros():
    batch = make_paged_batch(
        [1, 1],
        [9, 0],
        num_kv_heads=2,
        group=4,
        head_dim=64,
        page_size=16,
        dtype=torch.float32,
        seed=8,
    )
    args = (batch.q, batch.k_cache, batch.v_cache, batch.page_table, batch.seq_lens, batch.scale)
    out = paged_decode_attention_triton(*args, num_splits=2)
    ref = paged_decode_attention_ref(*args)
    torch.testing.assert_close(out[0], ref[0], **tolerance(torch.float32))
    assert torch.equal(out[1], torch.zeros_like(out[1]))


def test_default_splits_fill_the_device_within_bounds():
    """An H200 has 132 SMs: a big batch needs no split, batch 1 splits to the per-split floor."""
    assert default_num_splits(num_seqs=64, num_kv_heads=8, max_seq_len=4096, num_sms=132) == 2
    assert default_num_splits(num_seqs=1024, num_kv_heads=8, max_seq_len=4096, num_sms=132) == 1
    assert (
        default_num_splits(num_seqs=1, num_kv_heads=8, max_seq_len=4096, num_sms=132) == 4096 // 256
    )
    assert default_num_splits(num_seqs=1, num_kv_heads=8, max_seq_len=100, num_sms=132) == 1
    assert default_num_splits(num_seqs=1, num_kv_heads=1, max_seq_len=1 << 20, num_sms=132) == 64


@pytest.mark.gpu
def test_bench_shape_on_gpu():
    """The benchmark's shape: batch 64, 4096 context, 32 query / 8 KV heads, head_dim 128."""
    out, ref = _run(
        [4096] * 8 + [4000] * 8, num_kv_heads=8, group=4, head_dim=128, page_size=16,
        dtype=torch.bfloat16, seed=9,
    )  # fmt: skip
    torch.testing.assert_close(out, ref, **tolerance(torch.bfloat16))


@pytest.mark.gpu
def test_decode_replays_from_a_captured_cuda_graph():
    """Captured once, replayed with other lengths in the same buffers, as the executor runs decode."""
    batch = make_paged_batch(
        [1] * 4, [300, 64, 5, 200], num_kv_heads=2, group=4, head_dim=128, page_size=16,
        dtype=torch.bfloat16, seed=10,
    )  # fmt: skip
    args = (batch.q, batch.k_cache, batch.v_cache, batch.page_table, batch.seq_lens, batch.scale)
    replay = graphed(lambda: paged_decode_attention_triton(*args))
    batch.seq_lens.copy_(torch.tensor([17, 64, 0, 199], dtype=torch.int32))
    out = replay()
    torch.cuda.synchronize()
    ref = paged_decode_attention_ref(*args)
    torch.testing.assert_close(out[[0, 1, 3]], ref[[0, 1, 3]], **tolerance(torch.bfloat16))
    assert torch.equal(out[2], torch.zeros_like(out[2]))


# the one-launch path: a context of one token, both sides of page boundaries, many pages
SINGLE_PASS_LENS = [1, 15, 16, 17, 32, 33, 100]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("page_size", [1, 16])
def test_single_pass_matches_reference_across_page_boundaries(page_size, group, dtype):
    out, ref = _run(
        SINGLE_PASS_LENS, group=group, head_dim=64, page_size=page_size, dtype=dtype,
        seed=20 + group + page_size, num_splits=1,
    )  # fmt: skip
    assert not out.isnan().any()
    torch.testing.assert_close(out, ref, **tolerance(dtype))


def test_short_capacity_runs_one_launch_and_no_merge(monkeypatch):
    """A page table of at most SINGLE_PASS_MAX_CONTEXT positions takes the one-launch path:
    the merge kernel is never launched, and the output is the reference's."""
    from radixmesh_kernels import paged_decode_attention as pda

    class _NoMerge:
        def __getitem__(self, grid):
            raise AssertionError("the merge kernel ran on the one-launch path")

    monkeypatch.setattr(pda, "_decode_reduce_kernel", _NoMerge())
    out, ref = _run([1, 16, 17, 47], group=4, head_dim=64, page_size=16, dtype=torch.float32, seed=31)
    torch.testing.assert_close(out, ref, **tolerance(torch.float32))


def test_long_capacity_still_splits_and_merges(monkeypatch):
    from radixmesh_kernels import paged_decode_attention as pda

    merges = []
    real = pda._decode_reduce_kernel

    class _Counting:
        def __getitem__(self, grid):
            merges.append(grid)
            return real[grid]

    monkeypatch.setattr(pda, "_decode_reduce_kernel", _Counting())
    monkeypatch.setattr(pda, "SINGLE_PASS_MAX_CONTEXT", 32)
    monkeypatch.setattr(pda, "_MIN_TOKENS_PER_SPLIT", 16)
    out, ref = _run([70, 3], group=2, head_dim=64, page_size=16, dtype=torch.float32, seed=32)
    torch.testing.assert_close(out, ref, **tolerance(torch.float32))
    assert len(merges) == 1


def test_single_pass_and_split_paths_agree_with_a_sliding_window():
    batch = make_paged_batch(
        [1] * 4, [1, 16, 33, 70], num_kv_heads=2, group=4, head_dim=64, page_size=16,
        dtype=torch.float32, seed=33,
    )  # fmt: skip
    args = (batch.q, batch.k_cache, batch.v_cache, batch.page_table, batch.seq_lens, batch.scale)
    ref = paged_decode_attention_ref(*args, sliding_window=20)
    single = paged_decode_attention_triton(*args, sliding_window=20, num_splits=1)
    split = paged_decode_attention_triton(*args, sliding_window=20, num_splits=3)
    torch.testing.assert_close(single, ref, **tolerance(torch.float32))
    torch.testing.assert_close(split, ref, **tolerance(torch.float32))


def test_default_split_count_is_one_up_to_the_single_pass_context():
    from radixmesh_kernels.paged_decode_attention import SINGLE_PASS_MAX_CONTEXT

    at = SINGLE_PASS_MAX_CONTEXT
    assert default_num_splits(num_seqs=1, num_kv_heads=8, max_seq_len=at, num_sms=132) == 1
    assert default_num_splits(num_seqs=1, num_kv_heads=8, max_seq_len=at + 256, num_sms=132) > 1


@pytest.mark.gpu
@pytest.mark.parametrize("context", [1, 16, 17, 128, 512])
def test_single_pass_on_gpu_bench_heads(context):
    out, ref = _run(
        [context, max(context - 1, 1)], num_kv_heads=8, group=4, head_dim=128, page_size=16,
        dtype=torch.bfloat16, seed=34 + context, num_splits=1,
    )  # fmt: skip
    torch.testing.assert_close(out, ref, **tolerance(torch.bfloat16))


@pytest.mark.gpu
def test_single_pass_replays_from_a_captured_cuda_graph():
    """A narrow page table (short capacity) captures the one-launch path; replayed with
    other lengths, one of them empty."""
    batch = make_paged_batch(
        [1] * 3, [100, 17, 16], num_kv_heads=2, group=4, head_dim=128, page_size=16,
        dtype=torch.bfloat16, seed=35,
    )  # fmt: skip
    # captured at other lengths than replayed; every replayed position holds written K/V
    # (the cache past a sequence's length is NaN)
    batch.seq_lens.copy_(torch.tensor([100, 17, 5], dtype=torch.int32))
    args = (batch.q, batch.k_cache, batch.v_cache, batch.page_table, batch.seq_lens, batch.scale)
    replay = graphed(lambda: paged_decode_attention_triton(*args))
    batch.seq_lens.copy_(torch.tensor([99, 0, 16], dtype=torch.int32))
    out = replay()
    torch.cuda.synchronize()
    ref = paged_decode_attention_ref(*args)
    torch.testing.assert_close(out[[0, 2]], ref[[0, 2]], **tolerance(torch.bfloat16))
    assert torch.equal(out[1], torch.zeros_like(out[1]))


def test_decode_graph_widths_split_at_the_single_pass_capacity(monkeypatch):
    from radixmesh_kernels import paged_decode_attention as pda

    monkeypatch.setattr(pda, "SINGLE_PASS_MAX_CONTEXT", 512)
    assert pda.decode_graph_widths(512, 16) == [32, 512]
    assert pda.decode_graph_widths(32, 16) == [32]  # the whole table is short
    assert pda.decode_graph_widths(20, 16) == [20]
    assert pda.decode_graph_widths(8, 1024) == [8]  # a page holds more than the capacity
    # at each width the default path is the one the width stands for
    assert pda.default_num_splits(1, 8, 32 * 16, 132) == 1
    assert pda.default_num_splits(1, 8, 512 * 16, 132) > 1
    with pytest.raises(ValueError, match="max_pages_per_seq"):
        pda.decode_graph_widths(0, 16)
