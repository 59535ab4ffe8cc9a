"""The flattened batch: positions, slots, page table and logits rows, against a per-token loop."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from services.executor.core.cuda_graphs import batch_buckets
from services.executor.core.forward_batch import (
    PACK_ALIGN,
    BatchEntry,
    PageTables,
    build_batch,
    build_forward_batch,
    upload,
)

CPU = torch.device("cpu")


def per_token_reference(entries: list[BatchEntry], page_size: int) -> tuple[list[int], list[int]]:
    positions, slots = [], []
    for e in entries:
        for i in range(len(e.token_ids)):
            pos = e.num_computed_tokens + i
            positions.append(pos)
            slots.append(e.page_ids[pos // page_size] * page_size + pos % page_size)
    return positions, slots


def test_mixed_batch_layout_matches_a_per_token_loop() -> None:
    entries = [
        BatchEntry(0, [5, 6, 7, 8, 9], [3, 9], True),  # prefill
        BatchEntry(6, [11], [4, 2, 8], True),  # decode
        BatchEntry(8, [12, 13, 14], [0, 1, 7, 6], False),  # extend, a non-final chunk
    ]
    batch = build_forward_batch(entries, page_size=4, device=CPU)
    positions, slots = per_token_reference(entries, 4)
    assert batch.input_ids.tolist() == [5, 6, 7, 8, 9, 11, 12, 13, 14]
    assert batch.positions.tolist() == positions
    assert batch.slot_mapping.tolist() == slots
    assert batch.cu_seqlens_q.tolist() == [0, 5, 6, 9]
    assert batch.seq_lens.tolist() == [5, 7, 11]
    # width = pages needed by the longest sequence (11 tokens -> 3 pages); unused entries are 0
    assert batch.page_table.tolist() == [[3, 9, 0], [4, 2, 0], [0, 1, 7]]
    assert batch.logits_indices.tolist() == [4, 5]
    assert not batch.is_decode and batch.max_q_len == 5
    assert batch.page_table.dtype == torch.int32 and batch.slot_mapping.dtype == torch.int64


def test_decode_tokens_are_read_from_the_device_buffer() -> None:
    last_tokens = torch.tensor([70, 71, 72, 73])
    entries = [
        BatchEntry(3, [0], [1], True, device_row=2),
        BatchEntry(5, [0], [2, 3], True, device_row=0),
        BatchEntry(0, [40, 41], [5], True),
    ]
    batch = build_forward_batch(entries, page_size=4, device=CPU, last_tokens=last_tokens)
    assert batch.input_ids.tolist() == [72, 70, 40, 41]
    decode_only = build_forward_batch(entries[:2], page_size=4, device=CPU, last_tokens=last_tokens)
    assert decode_only.is_decode


def test_decode_graph_buckets_cover_every_batch_size() -> None:
    assert batch_buckets(1) == [1]
    assert batch_buckets(48) == [1, 2, 4, 8, 16, 32, 48]
    buckets = batch_buckets(256)
    assert buckets[:7] == [1, 2, 4, 8, 16, 32, 64] and buckets[-1] == 256
    assert all(b - a <= 32 for a, b in itertools.pairwise(buckets))


def test_host_page_tables_follow_appends_and_rows_in_any_order() -> None:
    tables = PageTables(num_rows=4, max_pages_per_seq=3)
    tables.write(2, 0, [9, 9, 9])  # a previous owner of row 2
    tables.write(2, 0, [5])  # its new owner: one page, then one more appended
    tables.write(2, 1, [6])
    tables.write(0, 0, [1, 2])
    tables.write(0, 2, [3, 4, 8])  # pages past max_pages_per_seq are never read: dropped
    assert tables.table[0].tolist() == [1, 2, 3] and tables.table[2].tolist() == [5, 6, 9]
    entries = [  # rows 2 then 0: an extend over 5 cached tokens, and a decode
        BatchEntry(5, [21, 22], [5, 6], True),
        BatchEntry(9, [23], [1, 2, 3], False),
    ]
    batch = build_batch(
        rows=np.array([2, 0]),
        starts=np.array([5, 9]),
        q_lens=np.array([2, 1]),
        samples=np.array([True, False]),
        from_device=np.array([False, False]),
        token_ids=np.array([21, 22, 23]),
        page_tables=tables,
        page_size=4,
        device=CPU,
    )
    positions, slots = per_token_reference(entries, 4)
    assert batch.positions.tolist() == positions and batch.slot_mapping.tolist() == slots
    assert batch.page_table.tolist() == [[5, 6, 0], [1, 2, 3]]  # row 2's stale 9 is not shown
    assert batch.sample_rows.tolist() == [2] and batch.token_src is None
    tables.write(2, 2, [7])
    assert batch.page_table[0].tolist() == [5, 6, 0]  # a built batch does not see later appends


def test_packed_upload_splits_back_into_each_array() -> None:
    arrays = [
        np.array([3, 1, 4], dtype=np.int64),
        np.array([[1, 5], [9, 2]], dtype=np.int32),
        np.zeros(0, dtype=np.int64),
        np.array([6], dtype=np.int32),
    ]
    for tensor, array in zip(upload(arrays, CPU, packed=True), arrays, strict=True):
        assert tensor.dtype == torch.from_numpy(array).dtype
        assert tensor.tolist() == array.tolist()


@pytest.mark.parametrize("sizes", [(3, 5, 1), (1, 1, 1, 1), (17, 0, 16, 2)])
def test_packed_upload_starts_every_int64_tensor_on_the_alignment_boundary(sizes) -> None:
    """Each tensor's offset in the packed buffer is a multiple of PACK_ALIGN elements
    whatever the lengths before it, so kernels see the same pointer alignment (one
    compiled specialization) for every batch shape."""
    arrays = [np.arange(n, dtype=np.int64) + 10 * i for i, n in enumerate(sizes)]
    tensors = upload(arrays, CPU, packed=True)
    base = tensors[0].data_ptr()
    for tensor, array in zip(tensors, arrays, strict=True):
        assert tensor.tolist() == array.tolist()
        if array.size:  # an empty tensor has no storage pointer
            assert (tensor.data_ptr() - base) % (PACK_ALIGN * 8) == 0
