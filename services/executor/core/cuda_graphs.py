"""Decode steps as captured CUDA graphs, one per batch-size bucket.

A decode forward launches a few hundred small kernels; replaying them as one
graph removes the per-launch host cost that otherwise dominates decode. Each
bucket's graph reads static input buffers; a batch of n sequences is copied
into the first n rows and the rows up to the bucket size are padding that
writes its key and value into a scratch page no request owns.
"""

from __future__ import annotations

import bisect

import torch

from services.executor.core.forward_batch import ForwardBatch
from services.executor.core.kv_pool import KVPool
from services.executor.core.models.decoder import Decoder

SMALL_BUCKETS = (1, 2, 4, 8, 16, 32)
BUCKET_STEP = 32


def batch_buckets(max_num_seqs: int) -> list[int]:
    """1, 2, 4, ... 32, then every 32 up to max_num_seqs (which is always a bucket)."""
    buckets = [b for b in SMALL_BUCKETS if b < max_num_seqs]
    buckets += list(range(BUCKET_STEP * 2, max_num_seqs, BUCKET_STEP))
    return sorted({*buckets, max_num_seqs})


class DecodeGraphs:
    def __init__(
        self,
        model: Decoder,
        kv_pool: KVPool,
        max_num_seqs: int,
        max_pages_per_seq: int,
        scratch_page: int,
    ) -> None:
        device = kv_pool.k_caches[0].device
        self.model = model
        self.kv_pool = kv_pool
        self.buckets = batch_buckets(max_num_seqs)
        self.max_pages_per_seq = max_pages_per_seq
        self._scratch_page = scratch_page
        self._scratch_slot = scratch_page * kv_pool.page_size
        rows = self.buckets[-1]

        def zeros(*shape: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        self.input_ids = zeros(rows, dtype=torch.int64)
        self.positions = zeros(rows, dtype=torch.int64)
        self.slot_mapping = zeros(rows, dtype=torch.int64)
        self.seq_lens = zeros(rows, dtype=torch.int32)
        self.page_table = zeros(rows, max_pages_per_seq, dtype=torch.int32)
        self._pad(0, rows)
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._batches: dict[int, ForwardBatch] = {}
        """Each graph's input tensors, kept alive as long as the graph reads them."""
        self._logits: dict[int, torch.Tensor] = {}
        self._pool = torch.cuda.graph_pool_handle()

    def capture(self) -> None:
        """Captures every bucket, largest first so smaller graphs reuse its memory."""
        for bucket in reversed(self.buckets):
            batch = self._batches[bucket] = self._static_batch(bucket)
            self.model.forward(batch, self.kv_pool)  # warm-up: compiles and tunes kernels
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            # thread_local: another executor may use the device from its own thread meanwhile
            with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                self._logits[bucket] = self.model.forward(batch, self.kv_pool)
            self._graphs[bucket] = graph
        torch.cuda.synchronize()

    def can_run(self, batch: ForwardBatch) -> bool:
        return (
            batch.is_decode
            and batch.num_seqs <= self.buckets[-1]
            and batch.page_table.shape[1] <= self.max_pages_per_seq
            and bool(self._graphs)
        )

    def run(self, batch: ForwardBatch) -> torch.Tensor:
        """[num_seqs, vocab] logits of a decode batch, by replaying its bucket's graph."""
        n = batch.num_seqs
        bucket = self.buckets[bisect.bisect_left(self.buckets, n)]
        self.input_ids[:n].copy_(batch.input_ids)
        self.positions[:n].copy_(batch.positions)
        self.slot_mapping[:n].copy_(batch.slot_mapping)
        self.seq_lens[:n].copy_(batch.seq_lens)
        self.page_table[:n, : batch.page_table.shape[1]].copy_(batch.page_table)
        self._pad(n, bucket)
        self._graphs[bucket].replay()
        return self._logits[bucket][batch.logits_indices]

    def _pad(self, start: int, end: int) -> None:
        if start >= end:
            return
        self.input_ids[start:end].zero_()
        self.positions[start:end].zero_()
        self.slot_mapping[start:end].fill_(self._scratch_slot)
        self.seq_lens[start:end].fill_(1)
        self.page_table[start:end, 0].fill_(self._scratch_page)

    def _static_batch(self, bucket: int) -> ForwardBatch:
        device = self.input_ids.device
        rows = torch.arange(bucket, dtype=torch.int64, device=device)
        return ForwardBatch(
            input_ids=self.input_ids[:bucket],
            positions=self.positions[:bucket],
            cu_seqlens_q=torch.arange(bucket + 1, dtype=torch.int32, device=device),
            seq_lens=self.seq_lens[:bucket],
            page_table=self.page_table[:bucket],
            slot_mapping=self.slot_mapping[:bucket],
            logits_indices=rows,
            is_decode=True,
            max_q_len=1,
        )
