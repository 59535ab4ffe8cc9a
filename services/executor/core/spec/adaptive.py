"""Per-sequence draft length: from the match length and the rolling acceptance rate."""

from __future__ import annotations

import math
from dataclasses import dataclass

ACCEPTANCE_DECAY = 0.7
"""Weight of the past in the rolling acceptance rate (per verified draft)."""


@dataclass(slots=True)
class DraftLength:
    """How many draft tokens a sequence's next verification should try.

    The draft is as long as `max_draft_tokens` times the rolling share of draft tokens
    accepted (at least one), and at most twice the matched suffix length: a short
    match predicts less far. Acceptance starts at 1 (the first draft tries them all).
    """

    max_draft_tokens: int
    acceptance: float = 1.0
    found: float = 1.0
    """Rolling share of the sequence's drafting steps whose proposer had a guess (starts
    at 1: the first step tries); a decode without one verifies nothing and gains nothing."""

    def limit(self, match_len: int) -> int:
        by_rate = max(1, math.ceil(self.max_draft_tokens * self.acceptance))
        return max(1, min(by_rate, 2 * match_len, self.max_draft_tokens))

    def note_guess(self, found: bool) -> None:
        """The proposer was asked for this sequence's draft and had one or not."""
        self.found = ACCEPTANCE_DECAY * self.found + (1 - ACCEPTANCE_DECAY) * found

    def update(self, num_draft_tokens: int, num_accepted: int) -> None:
        if num_draft_tokens <= 0:
            return
        rate = num_accepted / num_draft_tokens
        self.acceptance = ACCEPTANCE_DECAY * self.acceptance + (1 - ACCEPTANCE_DECAY) * rate
