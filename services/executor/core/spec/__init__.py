"""Speculative decoding without a draft model: proposers, draft lengths, verification.

A proposer guesses the next tokens of a sequence from text it has seen: the
sequence's own prompt and output (prompt lookup) or the recent outputs of
other sequences on this executor (a suffix index). The executor runs the
guess as an extend of k + 1 positions and keeps the longest prefix the target
model would have produced itself (verify.py), so the output is the one
speculation off gives, token for token, for greedy and seeded sampling alike.
"""

from services.executor.core.spec.adaptive import DraftLength, DraftPrior
from services.executor.core.spec.config import SPECULATIVE_METHODS, SpeculativeConfig
from services.executor.core.spec.proposers import (
    Draft,
    PromptLookup,
    Proposer,
    SuffixIndex,
    SuffixProposer,
    make_proposer,
)
from services.executor.core.spec.stats import SpecStats
from services.executor.core.spec.verify import accepted_length

__all__ = [
    "SPECULATIVE_METHODS",
    "Draft",
    "DraftLength",
    "DraftPrior",
    "PromptLookup",
    "Proposer",
    "SpecStats",
    "SpeculativeConfig",
    "SuffixIndex",
    "SuffixProposer",
    "accepted_length",
    "make_proposer",
]
