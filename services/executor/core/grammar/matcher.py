"""Per-sequence grammar state over xgrammar, and the batch calls the executor makes.

A `ConstraintMatcher` follows one sequence's output tokens through its
compiled constraint: it fills that sequence's bitmask row, accepts the
sampled token, and keeps the accepted tokens so that after a preemption it
can be rebuilt by replaying them. `accept_batch` accepts one token per
matcher in one call into the grammar library; `fill_batch_bitmask` fills the
rows of a batch (unconstrained rows all ones). Every row also keeps the output valid
UTF-8 (utf8.py: the grammar library admits encoded surrogates).

Jump-forward (spec/forced.py) reads the tokens the grammar forces through
`fill_bitmask`, `accept` and `rollback`: a row with one allowed token is a
forced one. xgrammar's `find_jump_forward_tokens` is not used: it spells the
forced text with the longest vocabulary tokens, which need not be the tokens
sampling would produce.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import xgrammar as xgr

from radixmesh.errors import FailedPrecondition, InvalidArgument
from services.executor.core.grammar.compiler import CompiledConstraint

ALL_ALLOWED = -1
"""An int32 word with every bit set: the 32 tokens it covers are allowed."""


class ConstraintMatcher:
    """Grammar state of one sequence (a `TokenMatcher`). Not thread-safe: one sequence,
    one thread at a time."""

    __slots__ = ("_matcher", "_token_ids", "compiled")

    def __init__(self, compiled: CompiledConstraint) -> None:
        self.compiled = compiled
        self._matcher = xgr.GrammarMatcher(compiled.grammar)
        self._token_ids: list[int] = []

    @property
    def token_ids(self) -> tuple[int, ...]:
        """Tokens accepted so far (the output, a stop token last once terminated)."""
        return tuple(self._token_ids)

    @property
    def is_terminated(self) -> bool:
        """A stop token was accepted after a complete match: the output is finished."""
        return self._matcher.is_terminated()

    def fill_bitmask(self, bitmask: torch.Tensor, row: int = 0) -> None:
        """Writes the allowed next tokens into bitmask[row] (a host int32 tensor).

        Once terminated, only the stop tokens are allowed (a sequence sampled one
        step past its end gets a stop token again).
        """
        if self._matcher.is_terminated():
            self._fill_stop_only(bitmask[row])
            return
        self._matcher.fill_next_token_bitmask(bitmask, row)
        if self.compiled.token_mask is not None:
            bitmask[row].bitwise_and_(self.compiled.token_mask)
        utf8 = self.compiled.utf8
        if utf8 is not None and utf8.follows_lead(self._token_ids):
            bitmask[row].bitwise_and_(utf8.after_lead_mask)

    def accept(self, token_id: int) -> bool:
        """Advances by one sampled token; False (state unchanged) if the grammar refuses it."""
        if token_id in self.compiled.banned_token_ids or self._splits_utf8(token_id):
            return False
        if not self._matcher.accept_token(token_id):
            return False
        self._token_ids.append(token_id)
        return True

    def _splits_utf8(self, token_id: int) -> bool:
        """token_id would complete a UTF-16 surrogate (which UTF-8 forbids) after the last."""
        utf8 = self.compiled.utf8
        return utf8 is not None and utf8.refuses(self._token_ids, token_id)

    def is_stop_token(self, token_id: int) -> bool:
        """Accepting token_id ends the grammar (a stop token it allows is accepted only
        where the output is complete)."""
        return token_id in self.compiled.stop_token_ids

    def rollback(self, num_tokens: int) -> None:
        """Undoes the last num_tokens accepts (at most as many as were accepted)."""
        if num_tokens <= 0:
            return
        if num_tokens > len(self._token_ids):
            raise FailedPrecondition(
                f"constraint rollback of {num_tokens} tokens after {len(self._token_ids)}"
            )
        self._matcher.rollback(num_tokens)
        del self._token_ids[-num_tokens:]

    def replay(self, token_ids: Sequence[int]) -> None:
        """Resets, then accepts token_ids in order: the state after a preemption and resume.

        Raises FailedPrecondition, leaving the matcher reset, if a token does not match.
        """
        self.reset()
        for position, token_id in enumerate(token_ids):
            if not self.accept(token_id):
                self.reset()
                raise FailedPrecondition(
                    f"constraint replay: token {token_id} at output position {position} "
                    "does not match the grammar"
                )

    def reset(self) -> None:
        """Back to the start of the grammar, no tokens accepted."""
        self._matcher.reset()
        self._token_ids.clear()

    def _fill_stop_only(self, row: torch.Tensor) -> None:
        row.zero_()
        for token_id in self.compiled.stop_token_ids:
            word, bit = divmod(token_id, 32)
            row[word] |= (1 << bit) - (1 << 32 if bit == 31 else 0)  # as a signed int32


def accept_batch(matchers: Sequence[ConstraintMatcher], token_ids: Sequence[int]) -> list[bool]:
    """`accept` for each pair, the grammar library called once for the batch."""
    if len(matchers) != len(token_ids):
        raise InvalidArgument(f"{len(matchers)} matchers for {len(token_ids)} tokens")
    rows = [
        i
        for i, (m, t) in enumerate(zip(matchers, token_ids, strict=True))
        if t not in m.compiled.banned_token_ids and not m._splits_utf8(t)
    ]
    accepted = [False] * len(matchers)
    if not rows:
        return accepted
    oks = xgr.BatchGrammarMatcher.batch_accept_token(
        [matchers[i]._matcher for i in rows], [token_ids[i] for i in rows]
    )
    for i, ok in zip(rows, oks, strict=True):
        if ok:
            matchers[i]._token_ids.append(token_ids[i])
            accepted[i] = True
    return accepted


def fill_batch_bitmask(matchers: Sequence[ConstraintMatcher | None], bitmask: torch.Tensor) -> bool:
    """Fills bitmask[i] for matchers[i]; rows of None (unconstrained) become all ones.

    `bitmask` is a host int32 tensor with at least len(matchers) rows of
    ceil(vocab_size/32) words. Returns whether any row constrains anything, so
    that the device apply can be skipped for an unconstrained batch.
    """
    if bitmask.dtype != torch.int32 or bitmask.device.type != "cpu" or bitmask.dim() != 2:
        raise InvalidArgument("bitmask: must be a 2-D int32 host tensor")
    if bitmask.shape[0] < len(matchers):
        raise InvalidArgument(f"bitmask: has {bitmask.shape[0]} rows for {len(matchers)} sequences")
    any_constrained = False
    for row, matcher in enumerate(matchers):
        if matcher is None:
            bitmask[row].fill_(ALL_ALLOWED)
        else:
            matcher.fill_bitmask(bitmask, row)
            any_constrained = True
    return any_constrained
