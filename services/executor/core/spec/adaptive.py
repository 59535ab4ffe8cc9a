"""Per-sequence draft length: from the match length and the rolling acceptance rate, and
the executor's rates over all its sequences, which a new sequence starts from."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

ACCEPTANCE_DECAY = 0.7
"""Weight of the past in the rolling acceptance rate (per verified draft)."""
PRIOR_DECAY = 0.98
"""Weight of the past in the executor's rates (per guess or verified draft of any sequence)."""
SETTLE_PREFIX = 2
"""A held guess whose first this many tokens the sequence has produced (none wrong yet) is
scored for them as a draft of that length kept whole, and its rest held on (`settle`). A
guess of k tokens that is right would otherwise be scored only once the sequence has
produced all k, one a step, and a sequence that copies resumes drafting that much later
after each edit (its rates fall at the edit and the steps decline until a guess is scored
kept). Two, not one: one token of a wrong guess matches by chance on common tokens."""


@dataclass(slots=True)
class DraftPrior:
    """What a sequence's drafts are expected to do before its own have said: the rolling
    share of guesses found and of draft tokens accepted over every sequence of the executor.
    A new sequence starts from them (its own rates soon take over), so a batch of new
    requests like the last ones, whose text does not repeat, is not drafted for on a
    promise of full acceptance until each has missed a few times. Both start at 1: the
    executor's first sequences try."""

    found: float = 1.0
    acceptance: float = 1.0
    padded: bool = False
    """Verification steps run padded to k + 1 rows a sequence (graphs), so a draft's
    length costs nothing there (`DraftLength.padded`, read from its prior)."""

    def new_length(self, max_draft_tokens: int) -> DraftLength:
        return DraftLength(max_draft_tokens, self.acceptance, self.found, prior=self)

    def best_guess(self, allowed: int) -> float:
        """The draft tokens a new sequence offered `allowed` can expect kept at most."""
        return _kept_at_most(self.found, self.acceptance, allowed, allowed, self.padded)


@dataclass(slots=True)
class DraftLength:
    """How many draft tokens a sequence's next verification should try.

    The draft is at most twice the matched suffix length (a short match predicts less
    far) and, where a verification's cost grows with its tokens (`padded` False: eager
    verification, on the CPU or without graphs), at most `max_draft_tokens` times the
    rolling share of draft tokens accepted (at least one). Where verifications replay
    graphs padded to k + 1 rows a sequence, a shorter draft saves nothing and can only keep
    less (a verification keeps the draft's right prefix), so the rate shortens none: on
    the trained fixture's code editing replayed at a GPU's ratio (bench/spec_steps.py),
    drafts cut by the rate took 53.0 plain-step units a request at k = 8 and 67.5 at 4,
    uncut 49.6 and 66.0 (bench/RESULTS.md). The rate still weighs what a draft is
    expected to keep (`best_guess`). Acceptance starts at the prior's (1 without one).
    """

    max_draft_tokens: int
    acceptance: float = 1.0
    found: float = 1.0
    """Rolling share of the sequence's drafting steps whose proposer had a guess (starts
    at the prior's); a decode without one verifies nothing and gains nothing."""
    prior: DraftPrior | None = None
    """The executor's rates, fed by this sequence's too."""
    num_guesses: int = 0
    """The times the proposer was asked for this sequence's draft."""
    unverified: list[int] | None = None
    """A guess asked for in a step that did not draft (`hold`), kept to be settled against
    the tokens the sequence produces instead (`settle`)."""
    unverified_at: int = 0
    """The position the unverified guess's first token would have taken."""
    ask_every: int = 1
    """While its steps decline: the declined steps from one guess of this sequence to its
    next (drafting.DeclinedSteps; 1 after a guess found, doubled after each one not)."""
    next_ask: int = 0
    """The declined step (the switch's `num_declined_asks`) from which it is asked again."""
    _best: tuple[int, float, float, float] = (-1, 0.0, 0.0, 0.0)
    """(allowed, found, acceptance, best_guess(allowed)) as last computed: the switch weighs
    every decode's best case after every step, and most rates have not changed since."""

    @property
    def padded(self) -> bool:
        """Its verifications are padded to k + 1 rows (its prior's, the class docstring):
        the rate cuts no draft."""
        return self.prior is not None and self.prior.padded

    def limit(self, match_len: int) -> int:
        return _draft_limit(self.acceptance, self.max_draft_tokens, match_len, self.padded)

    def best_guess(self, allowed: int) -> float:
        """The draft tokens this sequence offered `allowed` can expect kept at most: its
        guess as long as its draft length allows, weighed by its found rate and acceptance."""
        best, found, acceptance = self._best, self.found, self.acceptance
        if best[0] != allowed or best[1] != found or best[2] != acceptance:
            kept = _kept_at_most(found, acceptance, self.max_draft_tokens, allowed, self.padded)
            best = self._best = (allowed, found, acceptance, kept)
        return best[3]

    def note_guess(self, found: bool) -> None:
        """The proposer was asked for this sequence's draft and had one or not."""
        self.found = ACCEPTANCE_DECAY * self.found + (1 - ACCEPTANCE_DECAY) * found
        self.num_guesses += 1
        if self.prior is not None:
            self.prior.found = PRIOR_DECAY * self.prior.found + (1 - PRIOR_DECAY) * found

    def hold(self, guess: list[int], position: int) -> None:
        """A guess for `position` on that was not verified: `settle` scores it later."""
        self.unverified, self.unverified_at = guess, position

    def settle(self, token_ids: Sequence[int]) -> bool:
        """Score the unverified guess once the sequence's tokens decide it, as a verification
        would have: the tokens kept are its prefix that the sequence produced. A greedy
        sequence's kept prefix is exactly a verification's; a sampled one keeps each draft
        token with the probability the model gave it, as rejection sampling accepts it.
        Whether it was decided with tokens kept."""
        guess = self.unverified
        if guess is None:
            return False
        produced = token_ids[self.unverified_at : self.unverified_at + len(guess)]
        kept = 0
        while kept < len(produced) and produced[kept] == guess[kept]:
            kept += 1
        if kept < len(produced) or len(produced) == len(guess):  # decided
            self.unverified = None
            self.update(len(guess), kept)
            return kept > 0
        if kept >= SETTLE_PREFIX:  # right so far: a draft of these tokens would have kept them
            self.update(kept, kept)
            self.unverified, self.unverified_at = guess[kept:], self.unverified_at + kept
            return True
        return False

    def update(self, num_draft_tokens: int, num_accepted: int) -> None:
        if num_draft_tokens <= 0:
            return
        rate = num_accepted / num_draft_tokens
        self.acceptance = ACCEPTANCE_DECAY * self.acceptance + (1 - ACCEPTANCE_DECAY) * rate
        if (prior := self.prior) is not None:
            prior.acceptance = PRIOR_DECAY * prior.acceptance + (1 - PRIOR_DECAY) * rate


def _draft_limit(acceptance: float, max_draft_tokens: int, match_len: int, padded: bool) -> int:
    limit = min(2 * match_len, max_draft_tokens)
    if not padded:
        limit = min(limit, math.ceil(max_draft_tokens * acceptance))
    return max(1, limit)


def _kept_at_most(
    found: float, acceptance: float, max_draft_tokens: int, allowed: int, padded: bool
) -> float:
    """A guess as long as the draft length allows at the longest match, weighed by how often
    one is found and the share of its tokens kept."""
    length = min(allowed, _draft_limit(acceptance, max_draft_tokens, allowed, padded))
    return found * acceptance * length
