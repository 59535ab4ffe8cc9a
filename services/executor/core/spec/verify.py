"""Lossless verification of a draft against the target model's own samples.

The executor samples every one of the k + 1 verified positions with the
request's usual sampler: position j draws with the counter-based key of
(seed, output position base + j), exactly the draw the sequence would make
at that position without speculation. The draft is accepted while it equals
those samples; the first differing position emits the model's sample, and a
fully accepted draft emits the sample after it (the bonus token).

For greedy rows this is "accept while draft == argmax". For sampled rows it
is rejection sampling with a draft of probability 1, done with the sampler's
exponential race (argmax of p / E, E ~ Exp(1) per token): the race's winner is
the draft token with probability p(draft), and given that it is not, the
winner is distributed as p with the draft token removed and renormalised,
which is the residual distribution the rejection rule resamples from. So the
output distribution is the target's, and a seeded request gives the same
tokens with speculation on or off.
"""

from __future__ import annotations

from collections.abc import Sequence


def accepted_length(draft: Sequence[int], sampled: Sequence[int], num_allowed: int) -> int:
    """Leading draft tokens equal to the target's samples at their positions, among the
    first `num_allowed` (the draft cut where the grammar refused a token).

    `sampled` has len(draft) + 1 entries: the target's sample at each verified position.
    """
    accepted = 0
    for token, target in zip(draft[:num_allowed], sampled, strict=False):
        if token != target:
            break
        accepted += 1
    return accepted
