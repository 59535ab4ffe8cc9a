"""Batch-invariant linear and decode attention: the reference's values, and a row's bits
independent of the rest of the call (its other rows, their count, the page table's width)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from kernel_factories import DEVICE, make_paged_batch, tolerance

from radixmesh_kernels.batch_invariant import (
    MATMUL_BLOCK_M,
    SPLIT_LEN,
    batch_invariant_decode_attention_triton,
    batch_invariant_linear_ref,
    batch_invariant_linear_triton,
    decode_rows,
    num_splits_for,
)
from radixmesh_kernels.paged_attention import paged_attention_ref
from radixmesh_kernels.paged_decode_attention import paged_decode_attention_ref

LINEARS = [batch_invariant_linear_triton, batch_invariant_linear_ref]


def _operands(m: int, k: int, n: int, dtype: torch.dtype, seed: int, device=DEVICE):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(dtype).to(device)
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype).to(device)
    b = torch.randn(n, generator=gen).to(dtype).to(device)
    return x, w, b


@pytest.mark.parametrize("linear", LINEARS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_matches_reference(linear, dtype, with_bias):
    x, w, b = _operands(70, 96, 80, dtype, seed=1)
    bias = b if with_bias else None
    out = linear(x, w, bias)
    ref = F.linear(x.float(), w.float(), bias.float() if with_bias else None)
    assert out.dtype == dtype and out.shape == (70, 80)
    torch.testing.assert_close(out.float(), ref, **tolerance(dtype))


@pytest.mark.parametrize("linear", LINEARS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_row_is_the_same_bits_alone_and_in_any_m(linear, dtype):
    """Row r of the 2 * BLOCK_M + 3 row product equals the row computed alone and as a row of
    products of other heights (one, a tile and a row over, shifted so r sits elsewhere)."""
    m = 2 * MATMUL_BLOCK_M + 3
    x, w, b = _operands(m, 96, 72, dtype, seed=2)
    full = linear(x, w, b)
    for r in (0, 5, MATMUL_BLOCK_M, m - 1):
        assert torch.equal(linear(x[r : r + 1], w, b)[0], full[r]), f"row {r} alone"
    for height in (1, 3, MATMUL_BLOCK_M - 1, MATMUL_BLOCK_M, MATMUL_BLOCK_M + 1):
        for start in (0, 7):
            part = linear(x[start : start + height], w, b)
            assert torch.equal(part, full[start : start + height]), f"rows {start}+{height}"


def test_linear_keeps_leading_dims_and_empty_rows():
    x, w, b = _operands(6, 40, 24, torch.float32, seed=3)
    out = batch_invariant_linear_triton(x.reshape(2, 3, 40), w, b)
    assert out.shape == (2, 3, 24)
    assert torch.equal(out.reshape(6, 24), batch_invariant_linear_triton(x, w, b))
    assert batch_invariant_linear_triton(x[:0], w, b).shape == (0, 24)


def test_linear_refuses_mismatched_shapes():
    x, w, _ = _operands(4, 40, 24, torch.float32, seed=4)
    with pytest.raises(ValueError, match="features"):
        batch_invariant_linear_triton(x[:, :30], w)


def _decode(batch, *, page_table=None, seq_lens=None, q=None, window=None):
    return batch_invariant_decode_attention_triton(
        batch.q if q is None else q, batch.k_cache, batch.v_cache,
        batch.page_table if page_table is None else page_table,
        batch.seq_lens if seq_lens is None else seq_lens, batch.scale, window,
    )  # fmt: skip


def _paged(seq_lens, q_lens=None, *, dtype=torch.bfloat16, seed=0, group=4, page_size=16):
    return make_paged_batch(
        q_lens or [1] * len(seq_lens), seq_lens, num_kv_heads=2, group=group, head_dim=64,
        page_size=page_size, dtype=dtype, seed=seed,
    )  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 100])
def test_decode_matches_reference(dtype, window):
    """Contexts inside one split, on a split's edge and over several splits."""
    batch = _paged([1, 40, SPLIT_LEN, SPLIT_LEN + 1, 2 * SPLIT_LEN + 70], dtype=dtype, seed=7)
    out = _decode(batch, window=window)
    ref = paged_decode_attention_ref(
        batch.q, batch.k_cache, batch.v_cache, batch.page_table, batch.seq_lens, batch.scale,
        window,
    )  # fmt: skip
    assert not out.isnan().any()
    torch.testing.assert_close(out, ref, **tolerance(dtype))


def test_decode_padding_row_is_zero():
    batch = _paged([0, 30], seed=8)
    assert torch.equal(_decode(batch)[0], torch.zeros_like(batch.q[0]))


def test_a_sequence_is_the_same_bits_alone_in_any_batch_and_table_width():
    """Each sequence alone (a table just wide enough for it: fewer splits), beside longer
    and shorter neighbours, and with the table widened to many empty splits."""
    batch = _paged([2 * SPLIT_LEN + 70, 5, SPLIT_LEN + 3, 40], seed=9)
    together = _decode(batch)
    page_size = batch.k_cache.shape[1]
    wide = torch.cat([batch.page_table, batch.page_table[:, :1].expand(-1, 40)], dim=1)
    assert num_splits_for(wide.shape[1], page_size, None) > num_splits_for(
        batch.page_table.shape[1], page_size, None
    )
    assert torch.equal(_decode(batch, page_table=wide), together)
    for i, seq_len in enumerate(batch.seq_lens.tolist()):
        pages = -(-seq_len // page_size)
        alone = _decode(
            batch, q=batch.q[i : i + 1], page_table=batch.page_table[i : i + 1, :pages],
            seq_lens=batch.seq_lens[i : i + 1],
        )  # fmt: skip
        assert torch.equal(alone[0], together[i]), f"sequence {i}"
    shuffled = [3, 1, 0, 2]
    out = _decode(
        batch, q=batch.q[shuffled], page_table=batch.page_table[shuffled],
        seq_lens=batch.seq_lens[shuffled],
    )  # fmt: skip
    assert torch.equal(out, together[shuffled])


def test_verification_rows_equal_decodes_of_their_positions():
    """An extend of k + 1 = 4 rows per sequence through `decode_rows`: row j is bitwise the
    decode of position prefix + j alone, and close to the extend's causal attention."""
    seq_lens, q_lens = [SPLIT_LEN + 2, 37, 4], [4, 4, 3]
    batch = _paged(seq_lens, q_lens, seed=10)
    starts = [n - q for n, q in zip(seq_lens, q_lens, strict=True)]
    positions = torch.cat(
        [torch.arange(s, s + q) for s, q in zip(starts, q_lens, strict=True)]
    ).to(DEVICE)
    table, row_lens = decode_rows(batch.cu_seqlens_q, positions, batch.page_table)
    assert row_lens.tolist() == (positions + 1).tolist()
    verified = _decode(batch, page_table=table, seq_lens=row_lens)
    t = 0
    for b, q_len in enumerate(q_lens):
        for j in range(q_len):
            alone = _decode(
                batch, q=batch.q[t : t + 1], page_table=batch.page_table[b : b + 1],
                seq_lens=torch.tensor([starts[b] + j + 1], dtype=torch.int32, device=DEVICE),
            )  # fmt: skip
            assert torch.equal(alone[0], verified[t]), f"sequence {b} row {j}"
            t += 1
    ref = paged_attention_ref(
        batch.q, batch.k_cache, batch.v_cache, batch.page_table, batch.cu_seqlens_q,
        batch.seq_lens, batch.scale,
    )  # fmt: skip
    torch.testing.assert_close(verified, ref, **tolerance(torch.bfloat16))


@pytest.mark.gpu
def test_gpu_linear_rows_invariant_at_model_shapes():
    """bf16 at an 8B model's projection shapes, for every M a decode or verification uses."""
    x, w, b = _operands(160, 4096, 6144, torch.bfloat16, seed=11, device=torch.device("cuda"))
    full = batch_invariant_linear_triton(x, w, None)
    for m in (1, 2, 5, 8, 9, 32, 33, 64, 65, 128):
        assert torch.equal(batch_invariant_linear_triton(x[:m], w, None), full[:m]), m
    torch.testing.assert_close(full.float(), F.linear(x.float(), w.float()), atol=0.1, rtol=0.02)
    assert torch.equal(batch_invariant_linear_triton(x[3:4], w, b)[0], (
        batch_invariant_linear_triton(x[:9], w, b)[3]
    ))


def test_rows_in_chunks_are_the_same_bits(monkeypatch):
    """Past PARTIALS_BYTES of partials the rows run in chunks: the result does not change."""
    import radixmesh_kernels.batch_invariant as bi

    batch = _paged([SPLIT_LEN + 9, 3, 60, 2 * SPLIT_LEN, 17], seed=12)
    whole = _decode(batch)
    monkeypatch.setattr(bi, "PARTIALS_BYTES", 1)  # one row per launch
    assert torch.equal(_decode(batch), whole)
