"""Steps that are not plain decodes, as captured CUDA graphs bucketed by tokens and sequences.

An eager forward launches a few hundred kernels from Python; at 8B that host work is
longer than the device's for a step of a few hundred tokens (a select's choices scored
over their context, a fork's branches started beside sixty decodes), so such steps run at
the host's pace. `ExtendGraphs` replays them instead: one graph per (token bucket T,
sequence bucket S), captured over static buffers, with the batch laid out as it is:

- token rows [0, t) are the batch's rows in their order (so a prompt-scoring row, a
  logits row and a copied slot keep their indices); rows [t, T) are padding;
- sequences [0, n) are the batch's; sequences [n, S) run no tokens; sequence S owns the
  padding rows, at positions 0, 1, ... over the scratch page (its keys and values are
  written there and read back from there, nothing else is touched);
- attention is the paged prefill kernel for every sequence (decodes are one-row
  sequences), sized for T new tokens: sequences and query tiles past a sequence's own
  end exit at once;
- a step's partial-page copies (page_copy.py) are copied into a static list padded with
  copies of the scratch slot onto itself, so every layer runs the same copy launch;
- the graph writes the logits of up to S rows (`logits_indices`, padded with row 0) into a
  shared float32 buffer and keeps the final hidden states of every row, which a step
  that scores prompt tokens reads at its rows.

`run_eagerly` computes the padded layout with the eager forward: the layout's check where
no graph can be captured (CPU).
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from torch.cuda import _POOL_HANDLE

from services.executor.core.cuda_graphs import capture_graph
from services.executor.core.forward_batch import ForwardBatch
from services.executor.core.kv_pool import KVPool
from services.executor.core.models.decoder import Decoder

MIN_TOKEN_BUCKET = 32
SEQ_BUCKETS = (4, 8, 16, 32, 64, 128, 256, 512)
"""Sequence buckets below max_seqs (then max_seqs): powers of two, since attention's grid
has a program row per sequence of the bucket and a sequence past the step's exits at once."""
MAX_COPY_SLOTS = 1024
"""Copied KV slots a step may hold and still replay (a copy moves 1 to page_size - 1 slots;
a select step of five programs' four choices can copy about 200). The padding entries copy
the scratch slot onto itself, which the copy kernel skips."""


def token_buckets(max_tokens: int) -> list[int]:
    """32, 64, 128, ... below max_tokens, then max_tokens."""
    buckets, b = [], MIN_TOKEN_BUCKET
    while b < max_tokens:
        buckets.append(b)
        b *= 2
    return [*buckets, max_tokens]


def seq_buckets(max_seqs: int) -> list[int]:
    return sorted({*(b for b in SEQ_BUCKETS if b < max_seqs), max_seqs})


def extend_shapes(max_tokens: int, max_seqs: int) -> list[tuple[int, int]]:
    """(token bucket, sequence bucket) of every graph: a sequence bucket no larger than the
    token bucket (every sequence runs a token), the smallest one always."""
    seqs = seq_buckets(max_seqs)
    return [(t, s) for t in token_buckets(max_tokens) for s in seqs if s <= t or s == seqs[0]]


class ExtendGraphs:
    def __init__(
        self,
        model: Decoder,
        kv_pool: KVPool,
        max_tokens: int,
        max_seqs: int,
        max_pages_per_seq: int,
        scratch_page: int,
    ) -> None:
        if max_tokens < 1 or max_seqs < 1:
            raise ValueError(f"max_tokens and max_seqs must be >= 1, got {max_tokens}, {max_seqs}")
        if model.batch_invariant:
            raise ValueError("extend graphs: the batch-invariant mode runs extends as decode rows")
        self.model = model
        self.kv_pool = kv_pool
        self.token_buckets = token_buckets(max_tokens)
        self.seq_buckets = seq_buckets(max_seqs)
        self.shapes = extend_shapes(max_tokens, max_seqs)
        """(token bucket, sequence bucket) of every graph."""
        self.max_pages_per_seq = max_pages_per_seq
        self._scratch_page = scratch_page
        self._scratch_slot = scratch_page * kv_pool.page_size
        device = kv_pool.k_caches[0].device
        tokens, seqs = max_tokens, max(s for _, s in self.shapes)

        def zeros(*shape: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        self.input_ids = zeros(tokens, dtype=torch.int64)
        self.positions = zeros(tokens, dtype=torch.int64)
        self.slot_mapping = zeros(tokens, dtype=torch.int64)
        self.cu_seqlens_q = zeros(seqs + 2, dtype=torch.int32)
        self.seq_lens = zeros(seqs + 1, dtype=torch.int32)
        self.page_table = zeros(seqs + 1, max_pages_per_seq, dtype=torch.int32)
        self.logits_indices = zeros(seqs, dtype=torch.int64)
        self.copy_src = zeros(MAX_COPY_SLOTS, dtype=torch.int64)
        self.copy_dst = zeros(MAX_COPY_SLOTS, dtype=torch.int64)
        self._pad_positions = torch.arange(tokens, dtype=torch.int64, device=device)
        self._graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self._batches: dict[tuple[int, int], ForwardBatch] = {}
        self._hidden: dict[tuple[int, int], torch.Tensor] = {}
        """Each graph's final hidden states of every row (kept: a scoring step reads them)."""
        self._logits: torch.Tensor | None = None
        self.num_runs = 0

    @property
    def max_rows(self) -> int:
        """Logits rows of the largest graph (`capture_all` sizes the shared buffer by it)."""
        return max(s for _, s in self.shapes)

    @property
    def captured(self) -> bool:
        return bool(self._graphs)

    def capture(self, pool: _POOL_HANDLE | None = None, logits: torch.Tensor | None = None) -> None:
        """Captures every shape, the most tokens first (smaller graphs reuse its memory).
        `pool` and `logits`: shared with other graphs, as `StepGraphs.capture` takes them."""
        pool = torch.cuda.graph_pool_handle() if pool is None else pool
        for shape in sorted(self.shapes, reverse=True):
            batch = self._batches[shape] = self._static_batch(*shape)
            self._lay_out_empty(*shape)
            warm = self.model.forward(batch, self.kv_pool)  # compiles and tunes kernels
            if logits is None:
                logits = torch.empty(
                    self.max_rows, warm.shape[1], dtype=torch.float32, device=warm.device
                )
            self._logits = logits
            del warm

            def forward(batch: ForwardBatch = batch, logits: torch.Tensor = logits) -> torch.Tensor:
                hidden = self.model.hidden_states(batch, self.kv_pool)
                out = self.model.lm_head(hidden[batch.logits_indices])
                logits[: out.shape[0]].copy_(out)
                return hidden  # kept: a scoring step reads it

            self._graphs[shape], self._hidden[shape] = capture_graph(pool, forward)
        torch.cuda.synchronize()

    def shape_of(self, num_tokens: int, num_seqs: int) -> tuple[int, int] | None:
        """The smallest captured (token bucket, sequence bucket) that holds a step of
        `num_tokens` rows over `num_seqs` sequences (logits rows included); None: none."""
        if num_tokens > self.token_buckets[-1] or num_seqs > self.seq_buckets[-1]:
            return None
        t = self.token_buckets[bisect.bisect_left(self.token_buckets, num_tokens)]
        s = self.seq_buckets[bisect.bisect_left(self.seq_buckets, num_seqs)]
        for shape in ((t, s), *((tb, s) for tb in self.token_buckets if tb > t)):
            if shape in self.shapes:
                return shape
        return None

    def can_run(self, batch: ForwardBatch) -> bool:
        """A step that is not a plain decode, within the largest shape, whose page table
        and copies fit the static buffers."""
        copies = batch.slot_copies
        return (
            bool(self._graphs)
            and not batch.is_decode
            and self._shape(batch) is not None
            and batch.page_table.shape[1] <= self.max_pages_per_seq
            and (copies is None or copies[0].shape[0] <= MAX_COPY_SLOTS)
        )

    def _shape(self, batch: ForwardBatch) -> tuple[int, int] | None:
        """The batch's graph: its rows, and its sequences or logits rows if more."""
        return self.shape_of(
            batch.num_tokens, max(batch.num_seqs, int(batch.logits_indices.shape[0]))
        )

    def run(self, batch: ForwardBatch) -> torch.Tensor:
        """[len(batch.logits_indices), vocab] logits of the batch, by replaying its shape's
        graph over the padded layout (the module docstring)."""
        return self._run(batch)[0]

    def _run(self, batch: ForwardBatch) -> tuple[torch.Tensor, tuple[int, int]]:
        shape = self._lay_out(batch)
        self._replay(shape)
        self.num_runs += 1
        assert self._logits is not None
        return self._logits[: batch.logits_indices.shape[0]], shape

    def _replay(self, shape: tuple[int, int]) -> None:
        self._graphs[shape].replay()

    def run_scored(
        self, batch: ForwardBatch, rows: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`run`'s logits and the final hidden states at token rows `rows` (`Decoder.
        forward_scored`'s results)."""
        logits, shape = self._run(batch)
        return logits, self._hidden[shape][rows]

    def run_eagerly(self, batch: ForwardBatch) -> torch.Tensor:
        """What `run` computes, with the padded layout run eagerly instead of replayed (the
        layout's check where no graph can be captured: on CPU)."""
        shape = self._lay_out(batch)
        static = self._static_batch(*shape)
        return self.model.forward(static, self.kv_pool)[: batch.logits_indices.shape[0]]

    def _lay_out(self, batch: ForwardBatch) -> tuple[int, int]:
        """Copies the batch into the static buffers, padded (no device read); its shape."""
        t, n = batch.num_tokens, batch.num_seqs
        m = int(batch.logits_indices.shape[0])
        shape = self._shape(batch)
        if shape is None:
            raise ValueError(f"extend graphs: no graph holds {t} tokens of {n} sequences")
        tokens, seqs = shape
        width = batch.page_table.shape[1]
        self.input_ids[:t].copy_(batch.input_ids)
        self.input_ids[t:tokens].zero_()
        self.positions[:t].copy_(batch.positions)
        self.positions[t:tokens].copy_(self._pad_positions[: tokens - t])
        self.slot_mapping[:t].copy_(batch.slot_mapping)
        self.slot_mapping[t:tokens].fill_(self._scratch_slot)
        self.cu_seqlens_q[: n + 1].copy_(batch.cu_seqlens_q)
        self.cu_seqlens_q[n + 1 : seqs + 1].fill_(t)
        self.cu_seqlens_q[seqs + 1].fill_(tokens)
        self.seq_lens[:n].copy_(batch.seq_lens)
        self.seq_lens[n:seqs].zero_()
        self.seq_lens[seqs].fill_(tokens - t)
        self.page_table[:n, :width].copy_(batch.page_table)
        self.page_table[n : seqs + 1].fill_(self._scratch_page)
        self.logits_indices[:m].copy_(batch.logits_indices)
        self.logits_indices[m:seqs].zero_()
        copies = batch.slot_copies
        c = 0 if copies is None else int(copies[0].shape[0])
        if c > MAX_COPY_SLOTS:
            raise ValueError(f"extend graphs: {c} copied slots, at most {MAX_COPY_SLOTS}")
        if copies is not None:
            self.copy_src[:c].copy_(copies[0])
            self.copy_dst[:c].copy_(copies[1])
        self.copy_src[c:].fill_(self._scratch_slot)
        self.copy_dst[c:].fill_(self._scratch_slot)
        return shape

    def _lay_out_empty(self, tokens: int, seqs: int) -> None:
        """Every row padding (what a capture's warm-up and capture run over)."""
        self.input_ids[:tokens].zero_()
        self.positions[:tokens].copy_(self._pad_positions[:tokens])
        self.slot_mapping[:tokens].fill_(self._scratch_slot)
        self.cu_seqlens_q[: seqs + 1].zero_()
        self.cu_seqlens_q[seqs + 1].fill_(tokens)
        self.seq_lens[:seqs].zero_()
        self.seq_lens[seqs].fill_(tokens)
        self.page_table[: seqs + 1].fill_(self._scratch_page)
        self.logits_indices[:seqs].zero_()
        self.copy_src.fill_(self._scratch_slot)
        self.copy_dst.fill_(self._scratch_slot)

    def _static_batch(self, tokens: int, seqs: int) -> ForwardBatch:
        return ForwardBatch(
            input_ids=self.input_ids[:tokens],
            positions=self.positions[:tokens],
            cu_seqlens_q=self.cu_seqlens_q[: seqs + 2],
            seq_lens=self.seq_lens[: seqs + 1],
            page_table=self.page_table[: seqs + 1],
            slot_mapping=self.slot_mapping[:tokens],
            logits_indices=self.logits_indices[:seqs],
            is_decode=False,
            max_q_len=tokens,
            slot_copies=(self.copy_src, self.copy_dst),
            dense_attention=False,
        )
