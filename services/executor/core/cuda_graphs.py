"""Steps as captured CUDA graphs: one graph per batch-size bucket and rows per sequence.

A step's forward launches a few hundred small kernels; replaying them as one graph removes
the per-launch host cost that otherwise dominates decode. `StepGraphs(num_rows=r)` runs
`bucket` sequences of exactly r query rows each:

- r = 1: plain decodes. A batch of n sequences is copied into the first n rows.
- r = k + 1: steps that verify drafts (speculative decoding, jump-forward), or any extend
  whose sequences each run at most r tokens (a short prefill chunk too). Token t of
  sequence i goes to row i * r + (t - cu_seqlens_q[i]), on the device with no host read; a
  sequence's length becomes its cached prefix + r, so its real rows keep their positions
  (the causal offset is seq_len - q_len).

A set may also be captured at several page-table widths (`widths`, narrowest first): a
decode kernel may pick its path by the table's capacity (radixmesh_kernels/paged_decode_attention.py,
`decode_graph_widths`), so a step replays the narrowest width that holds its longest
sequence's pages.

Either way, rows up to the bucket's are padding: they write their key and value into a
scratch page no request owns, their logits are never read, and pad sequences past the
step's attend only to the scratch page. Prompt scoring never runs here (its hidden states
are read outside the graph).

Graphs of several `StepGraphs` may share one memory pool and one logits buffer (see
`capture_all`): they are captured one after another and replayed one at a time, and each
replay's logits are gathered out of the shared buffer before the next replay.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

import torch

if TYPE_CHECKING:
    from torch.cuda import _POOL_HANDLE

    from services.executor.core.extend_graphs import ExtendGraphs

from services.executor.core.forward_batch import ForwardBatch
from services.executor.core.kv_pool import KVPool
from services.executor.core.models.decoder import Decoder

T = TypeVar("T")

SMALL_BUCKETS = (1, 2, 4, 8, 16, 32)
BUCKET_STEP = 32


def batch_buckets(max_num_seqs: int) -> list[int]:
    """1, 2, 4, ... 32, then every 32 up to max_num_seqs (which is always a bucket)."""
    buckets = [b for b in SMALL_BUCKETS if b < max_num_seqs]
    buckets += list(range(BUCKET_STEP * 2, max_num_seqs, BUCKET_STEP))
    return sorted({*buckets, max_num_seqs})


def pages_per_seq(max_model_len: int, page_size: int, num_rows: int) -> int:
    """Page table columns of graphs of `num_rows` rows: a padded sequence reaches up to
    num_rows - 1 positions past its real end."""
    return -(-(max_model_len + num_rows - 1) // page_size)


class StepGraphs:
    def __init__(
        self,
        model: Decoder,
        kv_pool: KVPool,
        max_num_seqs: int,
        num_rows: int,
        max_pages_per_seq: int,
        scratch_page: int,
        widths: Sequence[int] | None = None,
    ) -> None:
        """`max_pages_per_seq`: page table columns (`pages_per_seq`); `widths`: the
        page-table widths to capture, ascending, the last max_pages_per_seq (default:
        that one)."""
        if num_rows < 1:
            raise ValueError(f"num_rows must be >= 1, got {num_rows}")
        widths = sorted(set(widths or [max_pages_per_seq]))
        if widths[0] < 1 or widths[-1] != max_pages_per_seq:
            raise ValueError(
                f"widths must be in [1, {max_pages_per_seq}] and end at it, got {widths}"
            )
        if num_rows > 1 and len(widths) > 1:  # padding reaches past a sequence's own pages
            raise ValueError(f"widths: graphs of {num_rows} rows take the whole table only")
        self.widths = widths
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
        self._graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        """By (bucket, page-table width)."""
        self._batches: dict[tuple[int, int], ForwardBatch] = {}
        """Each graph's input tensors, kept alive as long as the graph reads them."""
        self._logits: torch.Tensor | None = None
        """Where every graph writes its [bucket * num_rows, vocab] float32 logits."""
        self.num_runs = 0
        """Steps replayed (read by tests and benches)."""

    @property
    def max_rows(self) -> int:
        return self.buckets[-1] * self.num_rows

    @property
    def captured(self) -> bool:
        return bool(self._graphs)

    def capture(
        self, pool: _POOL_HANDLE | None = None, logits: torch.Tensor | None = None
    ) -> None:
        """Captures every bucket at every width, largest first so smaller graphs reuse its
        memory. `pool`: a graph pool shared with other graphs; `logits`: a float32 buffer
        of at least max_rows rows shared with them (both made here when not given)."""
        pool = torch.cuda.graph_pool_handle() if pool is None else pool
        shapes = [(b, w) for w in reversed(self.widths) for b in reversed(self.buckets)]
        for bucket, width in shapes:
            batch = self._batches[bucket, width] = self._static_batch(bucket, width)
            warm = self.model.forward(batch, self.kv_pool)  # compiles and tunes kernels
            if logits is None:
                logits = torch.empty_like(warm, dtype=torch.float32)
            self._logits = logits
            del warm

            def forward(batch: ForwardBatch = batch, logits: torch.Tensor = logits) -> None:
                out = self.model.forward(batch, self.kv_pool)
                logits[: out.shape[0]].copy_(out)  # out itself is freed for the next capture

            self._graphs[bucket, width] = capture_graph(pool, forward)[0]
        torch.cuda.synchronize()

    def can_run(self, batch: ForwardBatch) -> bool:
        """Plain decodes run in 1-row graphs; extends of at most num_rows tokens per
        sequence in the others."""
        return (
            batch.is_decode == (self.num_rows == 1)
            and batch.max_q_len <= self.num_rows
            and batch.num_seqs <= self.buckets[-1]
            and batch.page_table.shape[1] <= self.max_pages_per_seq
            and bool(self._graphs)
        )

    def bucket_of(self, num_seqs: int) -> int:
        return self.buckets[bisect.bisect_left(self.buckets, num_seqs)]

    def width_of(self, num_pages: int) -> int:
        """The narrowest captured width that holds a table of `num_pages` columns."""
        return self.widths[bisect.bisect_left(self.widths, num_pages)]

    def run(self, batch: ForwardBatch) -> torch.Tensor:
        """[len(batch.logits_indices), vocab] logits of the batch, by replaying its bucket's
        graph over the padded layout (see the module docstring)."""
        bucket, rows = self._lay_out(batch)
        self._graphs[bucket, self.width_of(batch.page_table.shape[1])].replay()
        self.num_runs += 1
        assert self._logits is not None
        return self._logits[rows]

    def replay(self, bucket: int) -> None:
        """Replays a bucket's graph at the widest table on whatever its buffers hold
        (timing; see graph_setup)."""
        self._graphs[bucket, self.widths[-1]].replay()

    def run_eagerly(self, batch: ForwardBatch) -> torch.Tensor:
        """What `run` computes, with the padded layout run eagerly instead of replayed (the
        layout's check where no graph can be captured: on CPU)."""
        bucket, rows = self._lay_out(batch)
        width = self.width_of(batch.page_table.shape[1])
        return self.model.forward(self._static_batch(bucket, width), self.kv_pool)[rows]

    def _lay_out(self, batch: ForwardBatch) -> tuple[int, torch.Tensor]:
        """Copies the batch into the static buffers, padded; (bucket, the padded rows of
        its logits_indices)."""
        n, k = batch.num_seqs, self.num_rows
        bucket = self.bucket_of(n)
        width = batch.page_table.shape[1]
        if k == 1:  # a decode: sequence i is row i
            self.input_ids[:n].copy_(batch.input_ids)
            self.positions[:n].copy_(batch.positions)
            self.slot_mapping[:n].copy_(batch.slot_mapping)
            self.seq_lens[:n].copy_(batch.seq_lens)
            self.page_table[:n, :width].copy_(batch.page_table)
            self._pad_rows(n, bucket)
            self._pad_seqs(n, bucket)
            return bucket, batch.logits_indices
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
        self.page_table[:n, :width].copy_(batch.page_table)
        self._pad_seqs(n, bucket)
        return bucket, dst[batch.logits_indices]

    def _pad_rows(self, start: int, end: int) -> None:
        if start >= end:
            return
        self.input_ids[start:end].zero_()
        self.positions[start:end].zero_()
        self.slot_mapping[start:end].fill_(self._scratch_slot)

    def _pad_seqs(self, start: int, end: int) -> None:
        if start >= end:
            return
        self.seq_lens[start:end].fill_(self.num_rows)
        self.page_table[start:end].fill_(self._scratch_page)

    def _static_batch(self, bucket: int, width: int) -> ForwardBatch:
        device = self.input_ids.device
        k = self.num_rows
        return ForwardBatch(
            input_ids=self.input_ids[: bucket * k],
            positions=self.positions[: bucket * k],
            cu_seqlens_q=torch.arange(0, (bucket + 1) * k, k, dtype=torch.int32, device=device),
            seq_lens=self.seq_lens[:bucket],
            page_table=self.page_table[:bucket, :width],
            slot_mapping=self.slot_mapping[: bucket * k],
            logits_indices=torch.arange(bucket * k, dtype=torch.int64, device=device),
            is_decode=k == 1,
            max_q_len=k,
        )


def capture_graph(pool: _POOL_HANDLE, body: Callable[[], T]) -> tuple[torch.cuda.CUDAGraph, T]:
    """`body` captured as a CUDA graph into `pool` (after the device's queued work), and what
    it returned (tensors it made live in the pool while referenced)."""
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    # thread_local: another executor may use the device from its own thread meanwhile
    with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
        result = body()
    return graph, result


def capture_all(graphs: Sequence[StepGraphs | ExtendGraphs], device: torch.device) -> int:
    """Captures every set into one graph pool and one logits buffer, the set with the most
    rows first (its memory is then reused by the others); returns the device memory the
    graphs hold, measured: free memory before less after, with the allocator's unused
    cache released both times (the warm-up forwards' blocks are not the graphs')."""
    if not graphs:
        return 0
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    free_before, _ = torch.cuda.mem_get_info(device)
    pool = torch.cuda.graph_pool_handle()
    ordered = sorted(graphs, key=lambda g: g.max_rows, reverse=True)
    logits: torch.Tensor | None = None
    for g in ordered:
        g.capture(pool, logits)
        logits = g._logits
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    free_after, _ = torch.cuda.mem_get_info(device)
    # the static input buffers were allocated before: count them too
    inputs = sum(
        t.numel() * t.element_size()
        for g in graphs
        for t in (g.input_ids, g.positions, g.slot_mapping, g.seq_lens, g.page_table)
    )
    return max(free_before - free_after, 0) + inputs
