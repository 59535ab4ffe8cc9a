"""The grammar's part of an executor step: accept the tokens sampled last and fill the
bitmask beside the forward, find the rows where the grammar must win over min_tokens,
upload the rows.

One host buffer of int32 [max_num_seqs, ceil(vocab_size / 32)] (pinned with CUDA) and
its device copy are allocated at the first constrained step and reused: a step's upload is
complete before the next step fills the buffer, since sampling reads its tokens back.
On CPU the fill runs on a worker thread while the forward computes; with CUDA the forward
is queued on the device and the fill runs on the calling thread meanwhile.

Per step the core calls `start` before its forward and `PendingMasks.result` after it;
rows are the step's samplers, in logits row order.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from radixmesh.sampling import Constraint
from radixmesh_kernels.bitmask import unpack_bitmask
from services.executor.core.grammar.interface import Grammar, SequenceGrammar, TokenMatcher


@dataclass(frozen=True, slots=True)
class StepMasks:
    """The grammar's answer for one step's samplers."""

    bitmask: torch.Tensor | None = None
    """The rows on the executor's device; None if no live row is constrained."""
    refused: frozenset[int] = frozenset()
    """Rows whose grammar refused the token sampled last: the core ends them ("abort")."""
    lifted: frozenset[int] = frozenset()
    """Rows short of min_tokens whose grammar allows only stop tokens: min_tokens is
    lifted there (the grammar wins, and the sequence ends with "stop")."""


@dataclass(frozen=True, slots=True)
class _HostFill:
    bitmask: torch.Tensor | None
    refused: frozenset[int] = frozenset()


class PendingMasks:
    """A step's masks being filled; `result` after the forward."""

    def __init__(
        self,
        step: StepGrammar,
        rows: Sequence[SequenceGrammar | None],
        output_lens: Sequence[int],
        fill: Future[_HostFill] | None,
    ) -> None:
        self._step, self._rows, self._output_lens, self._fill = step, rows, output_lens, fill

    def result(self) -> StepMasks:
        """The step's masks (filled here if they were not filled beside the forward)."""
        step = self._step
        host = self._fill.result() if self._fill is not None else step._fill(self._rows)
        if host.bitmask is None:
            return StepMasks(refused=host.refused)
        lifted = step._lifted(self._rows, self._output_lens, host.bitmask, host.refused)
        return StepMasks(step._upload(host.bitmask), host.refused, lifted)


class Unconstrained:
    """The pending masks of a step with no live constrained row (`UNCONSTRAINED`): nothing
    to accept, fill or upload, so the core skips `StepGrammar.start` and its rows."""

    __slots__ = ()

    def result(self) -> StepMasks:
        return NO_MASKS


NO_MASKS = StepMasks()
UNCONSTRAINED = Unconstrained()


class StepGrammar:
    """One executor core's grammar work: matchers for new sequences, masks per step.

    `grammar` None: the core has no grammar backend (constraints are refused before).
    """

    def __init__(
        self,
        grammar: Grammar[Any] | None,
        max_num_seqs: int,
        vocab_size: int,
        device: torch.device,
        eos_token_ids: Sequence[int],
    ) -> None:
        self.grammar = grammar
        self.max_num_seqs = max_num_seqs
        self.vocab_size = vocab_size
        self.device = device
        self._eos_token_ids = tuple(eos_token_ids)
        self._host: torch.Tensor | None = None
        self._device: torch.Tensor | None = None
        self._pool: ThreadPoolExecutor | None = None

    def admit(
        self,
        constraint: Constraint,
        output_token_ids: Sequence[int],
        min_tokens: int,
        stop_token_ids: Sequence[int],
    ) -> SequenceGrammar:
        """A new sequence's grammar, after the outputs it already has (a resumed one).

        Raises InvalidArgument for a constraint the backend refuses, FailedPrecondition
        for outputs that do not match it."""
        assert self.grammar is not None, "constraints are refused without a backend"
        matcher = self.grammar.matcher_for(constraint)
        matcher.replay(output_token_ids)
        return SequenceGrammar(matcher, min_tokens, (*self._eos_token_ids, *stop_token_ids))

    def start(
        self, rows: Sequence[SequenceGrammar | None], output_lens: Sequence[int]
    ) -> PendingMasks:
        """Before the forward: each live constrained row (None: unconstrained or ended)
        accepts its pending token, then fills its bitmask row; on CPU on the fill thread.

        `output_lens`: each row's number of output tokens before this step's sample."""
        fill = None
        if self.device.type == "cpu" and any(r is not None for r in rows):
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="grammar-fill")
            fill = self._pool.submit(self._fill, rows)
        return PendingMasks(self, rows, output_lens, fill)

    def fill_drafts(
        self, groups: Sequence[tuple[int, SequenceGrammar, Sequence[int]]], masks: StepMasks
    ) -> tuple[torch.Tensor | None, list[int]]:
        """After `PendingMasks.result`, for verified drafts: each (first row, grammar, draft)
        has its matcher accept the draft token by token, filling the row after each accept,
        up to the first token it refuses (the draft is cut there). Returns the bitmask on
        the device (uploaded again) and per group the draft tokens accepted; the caller
        rolls back those the verification rejects."""
        if not groups or masks.bitmask is None or self._host is None:
            return masks.bitmask, [len(g[2]) for g in groups]
        host = self._host[: masks.bitmask.shape[0]]
        cuts = []
        for first, grammar, draft in groups:
            num = 0
            if first not in masks.refused:
                for token_id in draft:
                    if not grammar.matcher.accept(token_id):
                        break
                    num += 1
                    grammar.matcher.fill_bitmask(host, first + num)
            cuts.append(num)
        return self._upload(host), cuts

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    # -- one step ------------------------------------------------------------

    def _fill(self, rows: Sequence[SequenceGrammar | None]) -> _HostFill:
        """The batch's pending tokens accepted in one call, then host rows (all ones where
        unconstrained, ended or refused)."""
        if all(r is None for r in rows):
            return _HostFill(None)
        accepting: list[int] = []
        matchers: list[TokenMatcher] = []
        token_ids: list[int] = []
        for i, row in enumerate(rows):
            if row is not None and row.pending_token is not None:
                accepting.append(i)
                matchers.append(row.matcher)
                token_ids.append(row.pending_token)
                row.pending_token = None
        refused: frozenset[int] = frozenset()
        if accepting:
            assert self.grammar is not None
            oks = self.grammar.accept_batch(matchers, token_ids)
            refused = frozenset(i for i, ok in zip(accepting, oks, strict=True) if not ok)
        if self._host is None or self._host.shape[0] < len(rows):  # drafts: k + 1 rows a seq
            words = (self.vocab_size + 31) // 32
            pin = self.device.type == "cuda"
            num_rows = max(self.max_num_seqs, len(rows))
            self._host = torch.empty((num_rows, words), dtype=torch.int32, pin_memory=pin)
        bitmask = self._host[: len(rows)]
        for i, row in enumerate(rows):
            if row is not None and i not in refused:
                row.matcher.fill_bitmask(bitmask, i)
            else:
                bitmask[i].fill_(-1)
        return _HostFill(bitmask, refused)

    def _upload(self, bitmask: torch.Tensor) -> torch.Tensor:
        """The filled rows on the executor's device (the host rows themselves on CPU)."""
        if self.device.type != "cuda":
            return bitmask
        if self._device is None or self._device.shape[0] < bitmask.shape[0]:
            assert self._host is not None
            self._device = torch.empty_like(self._host, device=self.device)
        device = self._device[: bitmask.shape[0]]
        device.copy_(bitmask, non_blocking=True)
        return device

    def _lifted(
        self,
        rows: Sequence[SequenceGrammar | None],
        output_lens: Sequence[int],
        bitmask: torch.Tensor,
        refused: frozenset[int],
    ) -> frozenset[int]:
        """Rows short of min_tokens whose grammar allows nothing but EOS and stop tokens.

        min_tokens would mask those as well and leave no token to sample: there the grammar
        wins (the caller lifts min_tokens, and the sequence ends with "stop").
        """
        lifted = set()
        for i, row in enumerate(rows):
            if row is None or i in refused or output_lens[i] >= row.min_tokens:
                continue
            if int(torch.count_nonzero(bitmask[i])) > len(row.stop_token_ids):
                continue  # more words allow something than there are stop ids
            allowed = unpack_bitmask(bitmask[i : i + 1], self.vocab_size)[0]
            allowed[[t for t in row.stop_token_ids if t < self.vocab_size]] = False
            if not bool(allowed.any()):
                lifted.add(i)
        return frozenset(lifted)
