"""Steps that verify drafts as captured CUDA graphs, one per batch-size bucket.

A step with drafts (speculative decoding, jump-forward) runs each decode as an extend of
its draft length + 1 positions, eagerly: the extend path's few hundred launches cost the
host about as much as a decode's do, which is what `DecodeGraphs` removes for plain
decodes. Here each bucket's graph runs `bucket` sequences of exactly `num_rows` (k + 1)
query rows; a step's sequences with fewer rows (a shorter draft, or none) are padded up
to it. The re-layout happens on the device with no host read: token t of sequence i goes
to row i * num_rows + (t - cu_seqlens_q[i]); a sequence's length becomes its cached
prefix + num_rows, so its real rows keep their positions (the causal offset is
seq_len - q_len); pad rows write their key and value into the scratch page and their
logits are never read, and pad sequences past the step's attend only to the scratch page.

Any extend whose sequences each run at most `num_rows` tokens fits (a short prefill chunk
too); prompt scoring never runs here (its hidden states are read outside the graph).
"""

from __future__ import annotations

import bisect

import torch

from services.executor.core.cuda_graphs import batch_buckets
from services.executor.core.forward_batch import ForwardBatch
from services.executor.core.kv_pool import KVPool
from services.executor.core.models.decoder import Decoder


class VerifyGraphs:
    def __init__(
        self,
        model: Decoder,
        kv_pool: KVPool,
        max_num_seqs: int,
        num_rows: int,
        max_pages_per_seq: int,
        scratch_page: int,
    ) -> None:
        """`max_pages_per_seq`: page table columns; a padded sequence reaches up to
        num_rows - 1 positions past its real end, so it covers max_model_len + num_rows."""
        assert num_rows >= 2, "a verification runs the decoded token and at least one draft"
        device = kv_pool.k_caches[0].device
        self.model = model
        self.kv_pool = kv_pool
        self.num_rows = num_rows
        self.buckets = batch_buckets(max_num_seqs)
        self.max_pages_per_seq = max_pages_per_seq
        self._scratch_page = scratch_page
        self._scratch_slot = scratch_page * kv_pool.page_size
        seqs = self.buckets[-1]
        rows = seqs * num_rows

        def zeros(*shape: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        self.input_ids = zeros(rows, dtype=torch.int64)
        self.positions = zeros(rows, dtype=torch.int64)
        self.slot_mapping = zeros(rows, dtype=torch.int64)
        self.seq_lens = zeros(seqs, dtype=torch.int32)
        self.page_table = zeros(seqs, max_pages_per_seq, dtype=torch.int32)
        self._pad_rows(0, rows)
        self._pad_seqs(0, seqs)
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._batches: dict[int, ForwardBatch] = {}
        """Each graph's input tensors, kept alive as long as the graph reads them."""
        self._logits: dict[int, torch.Tensor] = {}
        self.num_runs = 0
        """Steps replayed (read by tests and benches)."""

    def capture(self) -> None:
        """Captures every bucket, largest first so smaller graphs reuse its memory."""
        pool = torch.cuda.graph_pool_handle()
        for bucket in reversed(self.buckets):
            batch = self._batches[bucket] = self._static_batch(bucket)
            self.model.forward(batch, self.kv_pool)  # warm-up: compiles and tunes kernels
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                self._logits[bucket] = self.model.forward(batch, self.kv_pool)
            self._graphs[bucket] = graph
        torch.cuda.synchronize()

    def can_run(self, batch: ForwardBatch) -> bool:
        return (
            not batch.is_decode
            and batch.max_q_len <= self.num_rows
            and batch.num_seqs <= self.buckets[-1]
            and batch.page_table.shape[1] <= self.max_pages_per_seq
            and bool(self._graphs)
        )

    def run(self, batch: ForwardBatch) -> torch.Tensor:
        """[len(batch.logits_indices), vocab] logits of the batch, by replaying its bucket's
        graph over the padded layout (see the module docstring)."""
        bucket, rows = self._lay_out(batch)
        self._graphs[bucket].replay()
        self.num_runs += 1
        return self._logits[bucket][rows]

    def run_eagerly(self, batch: ForwardBatch) -> torch.Tensor:
        """What `run` computes, with the padded layout run eagerly instead of replayed (the
        layout's check where no graph can be captured: on CPU)."""
        bucket, rows = self._lay_out(batch)
        return self.model.forward(self._static_batch(bucket), self.kv_pool)[rows]

    def _lay_out(self, batch: ForwardBatch) -> tuple[int, torch.Tensor]:
        """Copies the batch into the static buffers, padded; (bucket, the padded rows of
        its logits_indices)."""
        n, k = batch.num_seqs, self.num_rows
        bucket = self.buckets[bisect.bisect_left(self.buckets, n)]
        cu = batch.cu_seqlens_q
        token = torch.arange(batch.num_tokens, dtype=cu.dtype, device=cu.device)
        seq = torch.searchsorted(cu[1:].contiguous(), token, right=True)  # each token's sequence
        dst = seq.to(torch.int64) * k + (token - cu[seq]).to(torch.int64)
        self._pad_rows(0, bucket * k)
        self.input_ids.index_copy_(0, dst, batch.input_ids)
        self.positions.index_copy_(0, dst, batch.positions)
        self.slot_mapping.index_copy_(0, dst, batch.slot_mapping)
        q_lens = cu[1:] - cu[:-1]
        self.seq_lens[:n].copy_(batch.seq_lens - q_lens + k)
        self.page_table[:n, : batch.page_table.shape[1]].copy_(batch.page_table)
        self._pad_seqs(n, bucket)
        return bucket, dst[batch.logits_indices]

    def _pad_rows(self, start: int, end: int) -> None:
        self.input_ids[start:end].zero_()
        self.positions[start:end].zero_()
        self.slot_mapping[start:end].fill_(self._scratch_slot)

    def _pad_seqs(self, start: int, end: int) -> None:
        if start >= end:
            return
        self.seq_lens[start:end].fill_(self.num_rows)
        self.page_table[start:end].fill_(self._scratch_page)

    def _static_batch(self, bucket: int) -> ForwardBatch:
        device = self.input_ids.device
        k = self.num_rows
        return ForwardBatch(
            input_ids=self.input_ids[: bucket * k],
            positions=self.positions[: bucket * k],
            cu_seqlens_q=torch.arange(0, (bucket + 1) * k, k, dtype=torch.int32, device=device),
            seq_lens=self.seq_lens[:bucket],
            page_table=self.page_table[:bucket],
            slot_mapping=self.slot_mapping[: bucket * k],
            logits_indices=torch.arange(bucket * k, dtype=torch.int64, device=device),
            is_decode=False,
            max_q_len=k,
        )
