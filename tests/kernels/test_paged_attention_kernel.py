"""Triton paged prefill/extend attention against the torch reference."""

from __future__ import annotations

import pytest
import torch
from kernel_factories import make_paged_batch, tolerance

from radixmesh_kernels.paged_attention import paged_attention_ref, paged_attention_triton

# (q_len, seq_len) per sequence: a fresh prefill, an extend over a cached
# prefix, a single-token extend, a sequence with nothing scheduled, and a
# prefill spanning two query blocks; none a multiple of 16.
MIXED = [(7, 7), (5, 38), (1, 20), (0, 9), (21, 21)]


def _run(pairs, *, group, head_dim, page_size, dtype, seed, num_kv_heads=2, **kwargs):
    q_lens, seq_lens = zip(*pairs, strict=True)
    batch = make_paged_batch(
        list(q_lens), list(seq_lens), num_kv_heads=num_kv_heads, group=group,
        head_dim=head_dim, page_size=page_size, dtype=dtype, seed=seed,
    )  # fmt: skip
    args = (
        batch.q,
        batch.k_cache,
        batch.v_cache,
        batch.page_table,
        batch.cu_seqlens_q,
        batch.seq_lens,
        batch.scale,
    )
    return paged_attention_triton(*args, **kwargs), paged_attention_ref(*args)


@pytest.mark.parametrize("pack_gqa", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("head_dim", [64, 80, 128])
def test_mixed_prefill_and_extend_match_reference(head_dim, group, page_size, dtype, pack_gqa):
    out, ref = _run(
        MIXED, num_kv_heads=1 if group == 8 else 2, group=group, head_dim=head_dim,
        page_size=page_size, dtype=dtype, seed=head_dim + group, pack_gqa=pack_gqa,
    )  # fmt: skip
    assert not out.isnan().any()
    torch.testing.assert_close(out, ref, **tolerance(dtype))


# decode rows beside extends (a mixed step), a verification's k + 1 rows, a sequence whose
# packed rows (tokens x group) fill several row blocks and end mid-block, over prefixes
# that start mid-page and end on a page's edge
PACKED = [(1, 40), (1, 1), (5, 33), (13, 77), (1, 64), (3, 3), (0, 5), (9, 32)]


@pytest.mark.parametrize(("group", "num_kv_heads"), [(2, 3), (4, 2), (8, 1)])
def test_packed_heads_match_the_reference_and_the_unpacked_kernel(group, num_kv_heads):
    kwargs = dict(
        num_kv_heads=num_kv_heads, group=group, head_dim=64, page_size=16,
        dtype=torch.float32, seed=group,
    )  # fmt: skip
    packed, ref = _run(PACKED, pack_gqa=True, **kwargs)
    unpacked, _ = _run(PACKED, pack_gqa=False, **kwargs)
    assert not packed.isnan().any()
    torch.testing.assert_close(packed, ref, **tolerance(torch.float32))
    torch.testing.assert_close(packed, unpacked, **tolerance(torch.float32))


def test_packed_tile_holds_a_sequences_rows_up_to_the_largest():
    from radixmesh_kernels.paged_attention import packed_launch

    assert [packed_launch(r)["BLOCK_M"] for r in (1, 16, 17, 32, 33, 64, 65, 4096)] == [
        16, 16, 32, 32, 64, 64, 64, 64,
    ]  # fmt: skip


def test_auto_packs_short_steps_whose_heads_and_sequences_fill_the_device(monkeypatch):
    import radixmesh_kernels.paged_attention as pa

    monkeypatch.setattr(pa, "PACK_GQA", "auto")
    h100 = {torch.device("cuda", 0): 132}  # a lent H100's count
    monkeypatch.setattr(pa, "num_multiprocessors", lambda device: h100.get(device, 2))
    gpu, cpu = torch.device("cuda", 0), torch.device("cpu")
    # verification at batch 1 (32 heads): 32 programs unpacked, one wave: not packed
    assert not pa.packs_by_default(5, 1 * 32, gpu)
    assert pa.packs_by_default(5, 8 * 32, gpu)  # batch 8: two waves unpacked
    assert pa.packs_by_default(24, 20 * 32, gpu)  # a select's 20 choices
    assert not pa.packs_by_default(pa.PACK_MAX_Q_LEN + 1, 64 * 32, gpu)  # a long step
    assert not pa.packs_by_default(5, 1, cpu)  # one (head, sequence) for two to fill
    assert pa.packs_by_default(5, 8, cpu)
    monkeypatch.setattr(pa, "PACK_GQA", "on")
    assert pa.packs_by_default(5, 1 * 32, gpu)
    monkeypatch.setattr(pa, "PACK_GQA", "off")
    assert not pa.packs_by_default(5, 20 * 32, gpu)


def test_max_q_len_hint_gives_the_same_output():
    pairs = [(3, 10), (18, 18)]
    hinted, ref = _run(
        pairs, group=2, head_dim=64, page_size=16, dtype=torch.float32, seed=1, max_q_len=18
    )
    torch.testing.assert_close(hinted, ref, **tolerance(torch.float32))


def test_extend_reads_the_cached_prefix():
    """The same new tokens over a different prefix must give a different output."""
    q_lens, seq_lens = [4], [30]
    kwargs = dict(num_kv_heads=1, group=1, head_dim=64, page_size=16, dtype=torch.float32)
    a = make_paged_batch(q_lens, seq_lens, seed=3, **kwargs)
    b = make_paged_batch(q_lens, seq_lens, seed=3, **kwargs)
    b.k_cache[b.page_table[0, 0].long(), 0] += 4.0  # position 0 of the prefix
    outs = [
        paged_attention_triton(
            x.q, x.k_cache, x.v_cache, x.page_table, x.cu_seqlens_q, x.seq_lens, x.scale
        )
        for x in (a, b)
    ]
    assert not torch.allclose(outs[0], outs[1], atol=1e-3)
    ref_b = paged_attention_ref(
        b.q, b.k_cache, b.v_cache, b.page_table, b.cu_seqlens_q, b.seq_lens, b.scale
    )
    torch.testing.assert_close(outs[1], ref_b, **tolerance(torch.float32))


@pytest.mark.parametrize(
    ("field", "change", "message"),
    [
        ("page_table", lambda t: t.long(), "page_table"),
        ("cu_seqlens_q", lambda t: t[:-1], "cu_seqlens_q"),
        ("v_cache", lambda t: t[:, :, :1], "v_cache"),
    ],
)
def test_layout_violations_name_the_field(field, change, message):
    batch = make_paged_batch(
        [2], [2], num_kv_heads=2, group=1, head_dim=64, page_size=16, dtype=torch.float32, seed=0
    )
    args = {
        "q": batch.q, "k_cache": batch.k_cache, "v_cache": batch.v_cache, "page_table": batch.page_table,
        "cu_seqlens_q": batch.cu_seqlens_q, "seq_lens": batch.seq_lens, "scale": batch.scale,
    }  # fmt: skip
    args[field] = change(args[field])
    with pytest.raises(ValueError, match=message):
        paged_attention_triton(**args)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128])
def test_long_prefill_batch_on_gpu(head_dim):
    pairs = [(1000, 1000), (517, 2000), (1, 4096), (2048, 2048)]
    out, ref = _run(
        pairs,
        num_kv_heads=8,
        group=4,
        head_dim=head_dim,
        page_size=16,
        dtype=torch.bfloat16,
        seed=7,
    )
    torch.testing.assert_close(out, ref, **tolerance(torch.bfloat16))
