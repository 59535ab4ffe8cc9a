"""The executor's grammar bitmask per step: accept the tokens sampled last and fill on the
host beside the forward, upload, and the rows where the grammar must win over min_tokens.

One host buffer of int32 [max_num_seqs, ceil(vocab_size / 32)] (pinned with CUDA) and
its device copy are allocated at the first constrained step and reused: a step's upload is
complete before the next step fills the buffer, since sampling reads its tokens back.
On CPU the fill runs on a worker thread while the forward computes; with CUDA the forward
is queued on the device and the fill runs on the calling thread meanwhile.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from kernels.bitmask import unpack_bitmask
from services.executor.core.sequence import SequenceState, TokenMatcher, accept_tokens


@dataclass(frozen=True, slots=True)
class MaskFill:
    bitmask: torch.Tensor | None
    """Host rows of the step's samplers; None if no live sequence is constrained."""
    refused: frozenset[int] = frozenset()
    """Rows whose grammar refused the token sampled last (their rows allow everything)."""


class GrammarMasks:
    """Bitmask rows of a step's samplers, in sampler order. Used by one executor core."""

    def __init__(self, max_num_seqs: int, vocab_size: int, device: torch.device) -> None:
        self.max_num_seqs = max_num_seqs
        self.vocab_size = vocab_size
        self.device = device
        self._host: torch.Tensor | None = None
        self._device: torch.Tensor | None = None
        self._pool: ThreadPoolExecutor | None = None

    def start_fill(self, seqs: list[SequenceState], live: list[bool]) -> Future | None:
        """On CPU, starts `fill` on the worker thread (None: fill on this thread, later)."""
        if self.device.type != "cpu" or not any_constrained(seqs, live):
            return None
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="grammar-fill")
        return self._pool.submit(self.fill, seqs, live)

    def fill(self, seqs: list[SequenceState], live: list[bool]) -> MaskFill:
        """Each live constrained sequence's grammar accepts its pending token (the batch in
        one call), then host rows for `seqs` (all ones where unconstrained, finished or
        refused)."""
        if not any_constrained(seqs, live):
            return MaskFill(None)
        rows: list[int] = []
        matchers: list[TokenMatcher] = []
        token_ids: list[int] = []
        for row, seq in enumerate(seqs):
            if live[row] and seq.matcher is not None and seq.pending_token is not None:
                rows.append(row)
                matchers.append(seq.matcher)
                token_ids.append(seq.pending_token)
                seq.pending_token = None
        oks = accept_tokens(matchers, token_ids) if rows else []
        refused = {row for row, ok in zip(rows, oks, strict=True) if not ok}
        if self._host is None:
            words = (self.vocab_size + 31) // 32
            pin = self.device.type == "cuda"
            self._host = torch.empty((self.max_num_seqs, words), dtype=torch.int32, pin_memory=pin)
        bitmask = self._host[: len(seqs)]
        for row, seq in enumerate(seqs):
            if seq.matcher is not None and live[row] and row not in refused:
                seq.matcher.fill_bitmask(bitmask, row)
            else:
                bitmask[row].fill_(-1)
        return MaskFill(bitmask, frozenset(refused))

    def upload(self, bitmask: torch.Tensor) -> torch.Tensor:
        """The filled rows on the executor's device (the host rows themselves on CPU)."""
        if self.device.type != "cuda":
            return bitmask
        if self._device is None:
            assert self._host is not None
            self._device = torch.empty_like(self._host, device=self.device)
        device = self._device[: bitmask.shape[0]]
        device.copy_(bitmask, non_blocking=True)
        return device

    def grammar_ends(
        self,
        seqs: list[SequenceState],
        live: list[bool],
        output_lens: list[int],
        bitmask: torch.Tensor,
        eos_token_ids: list[int],
    ) -> frozenset[int]:
        """Rows short of min_tokens whose grammar allows nothing but EOS and stop tokens.

        min_tokens would mask those as well and leave no token to sample: there the grammar
        wins (the caller lifts min_tokens, and the sequence ends with "stop").
        """
        ends = set()
        for i, seq in enumerate(seqs):
            if seq.matcher is None or not live[i] or output_lens[i] >= seq.sampling.min_tokens:
                continue
            stop_ids = [*eos_token_ids, *seq.sampling.stop_token_ids]
            if int(torch.count_nonzero(bitmask[i])) > len(stop_ids):
                continue  # more words allow something than there are stop ids
            allowed = unpack_bitmask(bitmask[i : i + 1], self.vocab_size)[0]
            allowed[[t for t in stop_ids if t < self.vocab_size]] = False
            if not bool(allowed.any()):
                ends.add(i)
        return frozenset(ends)

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def any_constrained(seqs: list[SequenceState], live: list[bool]) -> bool:
    return any(s.matcher is not None and ok for s, ok in zip(seqs, live, strict=True))
