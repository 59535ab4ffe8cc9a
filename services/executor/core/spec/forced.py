"""Jump-forward: the tokens a sequence's grammar forces, proposed as the head of its draft.

Where a constraint admits exactly one next token (the quote and colon after a key, a
comma, the letters of a key or an enum value once its prefix is unique), sampling under
the mask can only produce that token. `ForcedTokens.propose` walks the sequence's
matcher forward while its bitmask row has one bit set (a stop token aside), collects
that run and rolls the matcher back. The run is verified like any draft
(spec/verifier.py): each of its positions is sampled under its own mask row, which
admits only the draft's token, so the run is always accepted, and one extend of k + 1
positions emits the forced run and the token after it.

The tokens are the ones sampling would produce one by one (they are read off the mask,
not re-encoded from the forced text), so the output is token-identical to jump-forward
off, greedy and seeded alike, and no tokenization boundary arises.
"""

from __future__ import annotations

import numpy as np
import torch

from services.executor.core.grammar.interface import SequenceGrammar


def single_allowed(row: torch.Tensor, vocab_size: int) -> int | None:
    """The one token a host int32 bitmask row allows, or None (none, or more than one)."""
    words = row.numpy()
    nonzero = np.flatnonzero(words)
    if nonzero.size != 1:
        return None
    index = int(nonzero[0])
    word = int(words[index]) & 0xFFFFFFFF
    if word & (word - 1):
        return None  # two bits or more in the one word
    token_id = 32 * index + word.bit_length() - 1
    return token_id if token_id < vocab_size else None


class ForcedTokens:
    """Finds a constrained sequence's forced run (one per executor core; one thread).

    `vocab_size`: the model's; `max_tokens`: the longest run proposed.
    """

    def __init__(self, vocab_size: int, max_tokens: int) -> None:
        self.vocab_size = vocab_size
        self.max_tokens = max_tokens
        self._row = torch.empty((1, (vocab_size + 31) // 32), dtype=torch.int32)

    def propose(self, grammar: SequenceGrammar, max_tokens: int) -> list[int]:
        """The run of at most min(max_tokens, self.max_tokens) tokens the grammar forces
        after the sequence's last token; the matcher ends where it was.

        The sampled token not yet accepted (`pending_token`) is accepted here (the step
        that verifies the draft then has none to accept); a matcher that refuses it keeps
        it pending, so that step ends the sequence as it would without a draft. A run
        stops before a stop token: the token sampled after the draft (which the mask also
        forces) ends the output in the same step, so drafting it would save nothing."""
        matcher = grammar.matcher
        if grammar.pending_token is not None:
            if not matcher.accept(grammar.pending_token):
                return []
            grammar.pending_token = None
        run: list[int] = []
        row = self._row
        limit = min(max_tokens, self.max_tokens)
        while len(run) < limit:
            matcher.fill_bitmask(row, 0)
            token_id = single_allowed(row[0], self.vocab_size)
            if token_id is None or self._stops(grammar, token_id):
                break
            if not matcher.accept(token_id):
                break
            run.append(token_id)
        matcher.rollback(len(run))
        return run

    @staticmethod
    def _stops(grammar: SequenceGrammar, token_id: int) -> bool:
        return token_id in grammar.stop_token_ids or grammar.matcher.is_stop_token(token_id)
