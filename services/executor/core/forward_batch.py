"""The flattened batch one forward runs: prefill chunks, extends and decodes together.

Every sequence contributes `q_len` consecutive tokens starting at its
`num_computed_tokens` (0 for a fresh prefill, the cached prefix length for an
extend, len - 1 for a decode). Host-side arrays are built with numpy in a few
vectorised operations and copied to the device once each.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(slots=True)
class BatchEntry:
    """One sequence's part of a step, as the batch builder sees it."""

    num_computed_tokens: int
    token_ids: list[int]
    """The num_scheduled_tokens tokens to run; the last is a placeholder when device_row >= 0."""
    page_ids: list[int]
    """The sequence's page table (at least enough pages for the tokens after this step)."""
    samples: bool
    """Whether the step reaches the end of the known tokens, so the sequence needs logits."""
    device_row: int = -1
    """>= 0: the last token is the sequence's last sampled one, kept on the device in that row."""


@dataclass(slots=True)
class ForwardBatch:
    input_ids: torch.Tensor
    """[T] int64."""
    positions: torch.Tensor
    """[T] int64."""
    cu_seqlens_q: torch.Tensor
    """[B + 1] int32."""
    seq_lens: torch.Tensor
    """[B] int32, cached prefix + new tokens."""
    page_table: torch.Tensor
    """[B, max_pages] int32; unused entries are 0."""
    slot_mapping: torch.Tensor
    """[T] int64, page_id * page_size + offset for each new token."""
    logits_indices: torch.Tensor
    """[S] int64, rows of the last token of each sequence that samples, in batch order."""
    is_decode: bool
    """Every sequence runs exactly one token."""
    max_q_len: int
    """The most new tokens of one sequence (sizes attention grids without a device read)."""

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_seqs(self) -> int:
        return int(self.seq_lens.shape[0])


def build_forward_batch(
    entries: list[BatchEntry],
    page_size: int,
    device: torch.device,
    last_tokens: torch.Tensor | None = None,
) -> ForwardBatch:
    """Flattens entries into device tensors; reads device-held last tokens from `last_tokens`."""
    num_seqs = len(entries)
    q_lens = np.fromiter((len(e.token_ids) for e in entries), dtype=np.int64, count=num_seqs)
    starts = np.fromiter((e.num_computed_tokens for e in entries), dtype=np.int64, count=num_seqs)
    seq_lens = starts + q_lens
    cu_seqlens = np.zeros(num_seqs + 1, dtype=np.int64)
    np.cumsum(q_lens, out=cu_seqlens[1:])
    num_tokens = int(cu_seqlens[-1])

    input_ids = np.fromiter(
        itertools.chain.from_iterable(e.token_ids for e in entries),
        dtype=np.int64,
        count=num_tokens,
    )
    seq_of_token = np.repeat(np.arange(num_seqs), q_lens)
    positions = np.arange(num_tokens, dtype=np.int64) + (starts - cu_seqlens[:-1])[seq_of_token]

    pages_needed = (seq_lens + page_size - 1) // page_size
    width = int(pages_needed.max(initial=0))
    page_table = np.zeros((num_seqs, width), dtype=np.int32)
    page_table[np.arange(width) < pages_needed[:, None]] = np.fromiter(  # row-major fill
        itertools.chain.from_iterable(
            e.page_ids[:n] for e, n in zip(entries, pages_needed.tolist(), strict=True)
        ),
        dtype=np.int32,
        count=int(pages_needed.sum()),
    )
    slot_mapping = (
        page_table[seq_of_token, positions // page_size].astype(np.int64) * page_size
        + positions % page_size
    )
    last_rows = cu_seqlens[1:] - 1
    samples = np.fromiter((e.samples for e in entries), dtype=bool, count=num_seqs)

    def to_device(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        return torch.from_numpy(array).to(device=device, dtype=dtype, non_blocking=True)

    input_ids_t = to_device(input_ids, torch.int64)
    device_rows = np.fromiter((e.device_row for e in entries), dtype=np.int64, count=num_seqs)
    from_device = device_rows >= 0
    if from_device.any():
        if last_tokens is None:
            raise ValueError("entries read device-held tokens but no last_tokens buffer was given")
        src = to_device(device_rows[from_device], torch.int64)
        input_ids_t[to_device(last_rows[from_device], torch.int64)] = last_tokens[src]
    return ForwardBatch(
        input_ids=input_ids_t,
        positions=to_device(positions, torch.int64),
        cu_seqlens_q=to_device(cu_seqlens, torch.int32),
        seq_lens=to_device(seq_lens, torch.int32),
        page_table=to_device(page_table, torch.int32),
        slot_mapping=to_device(slot_mapping, torch.int64),
        logits_indices=to_device(last_rows[samples], torch.int64),
        is_decode=bool(num_seqs > 0 and (q_lens == 1).all()),
        max_q_len=int(q_lens.max(initial=0)),
    )
