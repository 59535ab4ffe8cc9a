"""The flattened batch one forward runs: prefill chunks, extends and decodes together.

Every sequence contributes `q_len` consecutive tokens starting at its
`num_computed_tokens` (0 for a fresh prefill, the cached prefix length for an
extend, len - 1 for a decode). Host arrays are built with numpy in a few
vectorised operations; page tables come from `PageTables`, a host copy of
every held sequence's pages updated as pages are appended, so a step costs
no per-page Python work. On CUDA every array travels in one pinned,
non-blocking host-to-device copy.

Tokens a sequence sampled on this executor are not on the host when the batch
is built (the step that samples them may not have run yet): the batch keeps
their rows, and `ForwardBatch.load_device_tokens` fills them from the
executor's device buffer right before the forward, in stream order.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch


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
    token_dst: torch.Tensor | None = None
    """[D] int64 rows of input_ids whose token is on the device; None when there are none."""
    token_src: torch.Tensor | None = None
    """[D] int64 rows of the device token buffer that hold those tokens."""
    sample_rows: torch.Tensor | None = None
    """[S] int64 buffer rows of the sequences that sample, in batch order (None: none given)."""
    slot_copies: tuple[torch.Tensor, torch.Tensor] | None = None
    """([N], [N]) int64 KV slots (source, destination) each layer copies after it stores
    the step's keys and values, before attention (page_copy.py); such a batch runs in no
    CUDA graph but the extend graphs (extend_graphs.py)."""
    dense_attention: bool = True
    """A long enough extend may give the prefill attention its new keys and values densely
    (models/decoder.py); False keeps the paged kernel (a captured graph, whose tensors
    are padded past the real tokens)."""

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_seqs(self) -> int:
        return int(self.seq_lens.shape[0])

    def load_device_tokens(self, last_tokens: torch.Tensor) -> None:
        """Copies device-held tokens into input_ids; call once, after they were sampled."""
        if self.token_src is None or self.token_dst is None:
            return
        if self.token_dst.shape[0] == self.input_ids.shape[0]:  # every token (pure decode)
            self.input_ids = last_tokens.index_select(0, self.token_src)
        else:
            self.input_ids[self.token_dst] = last_tokens[self.token_src]
        self.token_src = self.token_dst = None


class PageTables:
    """Host page tables of every buffer row: [num_rows, max_pages_per_seq] int32.

    Pages past `max_pages_per_seq` are never read (no position reaches them)
    and are not stored.
    """

    def __init__(self, num_rows: int, max_pages_per_seq: int) -> None:
        self.table = np.zeros((num_rows, max_pages_per_seq), dtype=np.int32)

    @property
    def max_pages_per_seq(self) -> int:
        return int(self.table.shape[1])

    def write(self, row: int, start: int, page_ids: list[int]) -> None:
        """Sets pages start, start + 1, ... of `row` to page_ids."""
        end = min(start + len(page_ids), self.table.shape[1])
        if end > start:
            self.table[row, start:end] = page_ids[: end - start]


def build_batch(
    rows: np.ndarray,
    starts: np.ndarray,
    q_lens: np.ndarray,
    samples: np.ndarray,
    from_device: np.ndarray,
    token_ids: np.ndarray,
    page_tables: PageTables,
    page_size: int,
    device: torch.device,
    num_logits: np.ndarray | None = None,
) -> ForwardBatch:
    """One batch from per-sequence arrays (B each) and the flat new tokens [T].

    rows: buffer rows (page table rows and device token rows); starts: the
    num_computed_tokens; samples: the sequence needs logits; from_device: its
    last new token is the one held in the device buffer at its row (the host
    value in token_ids is a placeholder); num_logits: how many of its last rows a
    sampling sequence needs logits for (a verified draft: k + 1), None: 1 each.
    """
    num_seqs = len(rows)
    seq_lens = starts + q_lens
    cu_seqlens = np.zeros(num_seqs + 1, dtype=np.int64)
    np.cumsum(q_lens, out=cu_seqlens[1:])
    num_tokens = int(cu_seqlens[-1])
    max_q_len = int(q_lens.max(initial=0))
    is_decode = bool(num_seqs > 0 and max_q_len == 1)
    if is_decode:
        positions = starts
    else:
        seq_of_token = np.repeat(np.arange(num_seqs), q_lens)
        positions = np.arange(num_tokens, dtype=np.int64) + (starts - cu_seqlens[:-1])[seq_of_token]

    pages_needed = (seq_lens + page_size - 1) // page_size
    width = int(pages_needed.max(initial=0))
    page_table = page_tables.table[rows, :width]  # a copy: later appends do not reach it
    if pages_needed.min(initial=width) < width:
        page_table[np.arange(width) >= pages_needed[:, None]] = 0
    token_rows = np.arange(num_seqs) if is_decode else seq_of_token
    slot_mapping = (
        page_table[token_rows, positions // page_size].astype(np.int64) * page_size
        + positions % page_size
    )
    last_rows = cu_seqlens[1:] - 1
    logits_rows = last_rows[samples]
    if num_logits is not None:
        counts = num_logits[samples]
        starts_of = np.repeat(logits_rows - counts + 1, counts)
        logits_rows = starts_of + np.arange(int(counts.sum())) - np.repeat(
            np.cumsum(counts) - counts, counts
        )
    arrays = [
        token_ids.astype(np.int64, copy=False),
        positions,
        cu_seqlens.astype(np.int32),
        seq_lens.astype(np.int32),
        page_table,
        slot_mapping,
        logits_rows,
        rows[samples],
    ]
    has_device_tokens = bool(from_device.any())
    if has_device_tokens:
        arrays += [last_rows[from_device], rows[from_device]]
    tensors = upload(arrays, device)
    return ForwardBatch(
        input_ids=tensors[0],
        positions=tensors[1],
        cu_seqlens_q=tensors[2],
        seq_lens=tensors[3],
        page_table=tensors[4],
        slot_mapping=tensors[5],
        logits_indices=tensors[6],
        is_decode=is_decode,
        max_q_len=max_q_len,
        sample_rows=tensors[7],
        token_dst=tensors[8] if has_device_tokens else None,
        token_src=tensors[9] if has_device_tokens else None,
    )


def build_decode_batch(
    rows: np.ndarray,
    starts: np.ndarray,
    page_tables: PageTables,
    page_size: int,
    device: torch.device,
) -> ForwardBatch:
    """`build_batch` of a step in which each of the B sequences (B >= 1) decodes the token
    held on the device at its row, and samples: the same batch, from fewer array ops."""
    num_seqs = len(rows)
    seq_lens = starts + 1
    pages_needed = (seq_lens + page_size - 1) // page_size
    width = int(pages_needed.max())
    page_table = page_tables.table[rows, :width]  # a copy: later appends do not reach it
    if num_seqs > 1 and pages_needed.min() < width:
        page_table[np.arange(width) >= pages_needed[:, None]] = 0
    slot_mapping = (
        page_table[np.arange(num_seqs), starts // page_size].astype(np.int64) * page_size
        + starts % page_size
    )
    arrays = [
        np.zeros(num_seqs, dtype=np.int64),
        starts,
        np.arange(num_seqs + 1, dtype=np.int32),
        seq_lens.astype(np.int32),
        page_table,
        slot_mapping,
        np.arange(num_seqs, dtype=np.int64),  # every sequence's one row samples
        rows,
        np.arange(num_seqs, dtype=np.int64),  # every token is on the device
        rows,
    ]
    t = upload(arrays, device)
    return ForwardBatch(
        input_ids=t[0], positions=t[1], cu_seqlens_q=t[2], seq_lens=t[3], page_table=t[4],
        slot_mapping=t[5], logits_indices=t[6], is_decode=True, max_q_len=1, sample_rows=t[7],
        token_dst=t[8], token_src=t[9],
    )  # fmt: skip


def build_verify_batch(
    rows: list[int],
    starts: list[int],
    host_tokens: list[list[int] | None],
    page_tables: PageTables,
    page_size: int,
    device: torch.device,
) -> ForwardBatch:
    """`build_batch` of a step in which each of the B sequences (B >= 1) samples every
    position it runs: the tokens `host_tokens` gives it from its start (its last known
    token and the draft to verify after it) or, where None, the one token held on the
    device at its row (a plain decode). The same batch from a Python pass over the tokens
    and a few array operations: a verifying step is prepared only once the step before
    has executed (its drafts continue the token sampled last), so its host work is on the
    critical path, and the general batch's forty-odd array operations on a handful of
    rows cost it more than the Python does."""
    num_seqs = len(rows)
    token_ids: list[int] = []
    positions: list[int] = []
    seq_of_token: list[int] = []
    cu_seqlens = [0]
    seq_lens: list[int] = []
    token_dst: list[int] = []
    token_src: list[int] = []
    max_q_len = 1
    for i, (row, start, host) in enumerate(zip(rows, starts, host_tokens, strict=True)):
        if host is None:
            token_dst.append(len(token_ids))
            token_src.append(row)
        tokens = host if host is not None else _PLACEHOLDER  # filled from the device buffer
        q_len = len(tokens)
        max_q_len = max(max_q_len, q_len)
        token_ids += tokens
        positions += range(start, start + q_len)
        seq_of_token += [i] * q_len
        cu_seqlens.append(len(token_ids))
        seq_lens.append(start + q_len)
    flat = np.array((token_ids, positions, seq_of_token), dtype=np.int64)
    per_seq = np.array((rows, seq_lens), dtype=np.int64)
    pages_needed = [(n + page_size - 1) // page_size for n in seq_lens]
    width = max(pages_needed)
    page_table = page_tables.table[per_seq[0], :width]  # a copy: later appends do not reach it
    if min(pages_needed) < width:
        page_table[np.arange(width) >= np.array(pages_needed)[:, None]] = 0
    position = flat[1]
    slot_mapping = (
        page_table[flat[2], position // page_size].astype(np.int64) * page_size
        + position % page_size
    )
    arrays = [
        flat[0],
        position,
        np.array(cu_seqlens, dtype=np.int32),
        per_seq[1].astype(np.int32),
        page_table,
        slot_mapping,
        np.arange(len(token_ids), dtype=np.int64),  # every position samples
        per_seq[0],
    ]
    if token_dst:
        arrays.append(np.array((token_dst, token_src), dtype=np.int64))
    t = upload(arrays, device)
    return ForwardBatch(
        input_ids=t[0], positions=t[1], cu_seqlens_q=t[2], seq_lens=t[3], page_table=t[4],
        slot_mapping=t[5], logits_indices=t[6], is_decode=max_q_len == 1 and num_seqs > 0,
        max_q_len=max_q_len, sample_rows=t[7],
        token_dst=t[8][0] if token_dst else None, token_src=t[8][1] if token_dst else None,
    )  # fmt: skip


_PLACEHOLDER = [0]
"""The host token of a row whose token is on the device."""


def upload(
    arrays: list[np.ndarray], device: torch.device, packed: bool | None = None
) -> list[torch.Tensor]:
    """int64/int32 host arrays as tensors on `device`, same shapes and dtypes.

    Unpacked (the default on CPU) they share the arrays' memory. Packed (the
    default on CUDA) they go into one buffer, pinned on CUDA, copied with one
    non-blocking transfer (the caching host allocator keeps the buffer until
    the copy is done) and split on the device.
    """
    if not (device.type == "cuda" if packed is None else packed):
        return [torch.from_numpy(a) for a in arrays]
    parts: list[np.ndarray] = []
    offsets: list[int] = []
    offset = 0
    for a in arrays:  # each starts on a PACK_ALIGN boundary of the buffer
        offsets.append(offset)
        parts.append(a.ravel())
        if pad := -a.size % PACK_ALIGN:
            parts.append(_PADDING[:pad])
        offset += a.size + pad
    host = torch.from_numpy(np.concatenate(parts, dtype=np.int64))
    if device.type == "cuda":
        host = host.pin_memory()
    staged = host.to(device, non_blocking=True)
    tensors = []
    for a, start in zip(arrays, offsets, strict=True):
        tensor = staged[start : start + a.size].view(a.shape)
        tensors.append(tensor.to(torch.int32) if a.dtype == np.int32 else tensor)
    return tensors


PACK_ALIGN = 16
"""int64 elements (128 bytes) a packed upload's tensors start on: a kernel specializes on
its pointers' alignment, so an offset that moves with the batch's shape (a tensor after
an odd number of tokens) would compile it again at request time."""
_PADDING = np.zeros(PACK_ALIGN, dtype=np.int64)


@dataclass(slots=True)
class BatchEntry:
    """One sequence's part of a step, for `build_forward_batch` (tests, tools)."""

    num_computed_tokens: int
    token_ids: list[int]
    """The num_scheduled_tokens tokens to run; the last is a placeholder when device_row >= 0."""
    page_ids: list[int]
    """The sequence's page table (at least enough pages for the tokens after this step)."""
    samples: bool
    """Whether the step reaches the end of the known tokens, so the sequence needs logits."""
    device_row: int = -1
    """>= 0: the last token is the sequence's last sampled one, kept on the device in that row."""


def build_forward_batch(
    entries: list[BatchEntry],
    page_size: int,
    device: torch.device,
    last_tokens: torch.Tensor | None = None,
) -> ForwardBatch:
    """A batch from self-contained entries; reads device-held tokens from `last_tokens`."""
    num_seqs = len(entries)
    tables = PageTables(num_seqs, max((len(e.page_ids) for e in entries), default=0))
    for row, e in enumerate(entries):
        tables.write(row, 0, e.page_ids)
    device_rows = np.fromiter((e.device_row for e in entries), dtype=np.int64, count=num_seqs)
    from_device = device_rows >= 0
    batch = build_batch(
        np.arange(num_seqs),
        np.fromiter((e.num_computed_tokens for e in entries), dtype=np.int64, count=num_seqs),
        np.fromiter((len(e.token_ids) for e in entries), dtype=np.int64, count=num_seqs),
        np.fromiter((e.samples for e in entries), dtype=bool, count=num_seqs),
        from_device,
        np.fromiter(itertools.chain.from_iterable(e.token_ids for e in entries), dtype=np.int64),
        tables,
        page_size,
        device,
    )
    if from_device.any():
        if last_tokens is None:
            raise ValueError("entries read device-held tokens but no last_tokens buffer was given")
        batch.token_src = torch.from_numpy(device_rows[from_device]).to(device)
        batch.load_device_tokens(last_tokens)
    return batch
